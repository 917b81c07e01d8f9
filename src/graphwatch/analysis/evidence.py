"""Small helpers the detectors share: naming a site, its variable, a backward's tensor, sizes, steps.

Example::

    >>> from graphwatch.analysis.evidence import assigned_name, backward_target, human_bytes, steps_text
    >>> assigned_name("h, c = cell(x, (h, c))"), assigned_name("total_loss += loss")
    ('h', 'total_loss')
    >>> backward_target("loss2.backward(retain_graph=True)"), backward_target("torch.autograd.grad(out, x)")
    ('loss2', 'out')
    >>> human_bytes(3 * 1024 * 1024), steps_text([0, 1, 2, 3, 6])
    ('3.0 MiB', 'steps 0..6')
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Sequence

from ..capture.lines.source import assigned_names, innermost_function, module_node
from ..model import BackwardRecord, CallSite, NodeRecord, StepRecord, Trace

_TARGET = re.compile(r"^\s*([A-Za-z_][\w.]*(?:\[[^\]]*\])?)\s*(?:,[^=]*)?(?:[-+*/@]?=)(?!=)")
_NEAR = 512  # records of other steps read in a row before giving up: a step's nodes are recorded together
_BACKWARD_ON = re.compile(r"([A-Za-z_][\w.]*(?:\[[^\]]*\])?)\s*\.backward\(")
_BACKWARD_SCALED = re.compile(r"\.scale\(\s*([A-Za-z_][\w.]*)\s*\)\s*\.backward\(")  # a GradScaler's
_BACKWARD_OF = re.compile(r"(?:autograd\.backward|autograd\.grad|\bgrad)\(\s*\[?\s*([A-Za-z_][\w.]*)")
_CALL_ON = re.compile(r"([A-Za-z_][\w.]*)\.step\(")


def assigned_name(source: str) -> str | None:
    """The first variable a line of source assigns to, if it is an assignment."""
    match = _TARGET.match(source)
    return match.group(1) if match else None


def reads_name(source: str, name: str, dotted: bool = False) -> bool:
    """Whether a line of source reads the variable ``name`` (with ``dotted``, also a dotted name: ``self.sum``),
    not only assigns it; False for a line that does not parse alone.

    >>> reads_name("all_losses.append(current_loss / 4)", "current_loss"), reads_name("current = 0", "current")
    (True, False)
    >>> reads_name("self.avg = self.sum / self.count", "self.sum", dotted=True), reads_name("self.sum += v", "self.sum", True)
    (True, False)
    """
    try:
        tree = ast.parse(source.strip())
    except SyntaxError:
        return False
    kinds = (ast.Name, ast.Attribute) if dotted else ast.Name
    return any(isinstance(n, kinds) and isinstance(n.ctx, ast.Load) and ast.unparse(n) == name for n in ast.walk(tree))


def stored_part(source: str, within: str) -> str | None:
    """The expression of the value a line stores (appends, or assigns) that sits at ``within`` of it: ``action``
    for ``[1]`` of ``buffer.append((state, action, reward))``, ``loss`` for ``['loss']`` of
    ``history.append({"loss": loss})``; None unless that value is a tuple, list or dict written out on the line.

    >>> stored_part("buffer.append((state, action, reward))", "[1]"), stored_part("buffer.append(t)", "[1]")
    ('action', None)
    >>> stored_part('kept.append({"step": i, "pred": net(x)})', "['pred']")
    'net(x)'
    """
    try:
        statement = ast.parse(source.strip()).body[0]
        path = ast.parse(f"_{within}", mode="eval").body
    except (SyntaxError, IndexError):
        return None
    value: ast.expr | None = getattr(statement, "value", None)
    if isinstance(value, ast.Call) and len(value.args) == 1:  # ``buffer.append(...)``
        value = value.args[0]
    keys: list[object] = []
    while isinstance(path, ast.Subscript) and isinstance(path.slice, ast.Constant):
        keys.append(path.slice.value)
        path = path.value
    if not keys or not isinstance(path, ast.Name):
        return None
    for key in reversed(keys):
        value = _item_written(value, key)
        if value is None:
            return None
    return ast.unparse(value) if value is not None else None


def _item_written(value: ast.expr | None, key: object) -> ast.expr | None:
    """The expression at ``key`` of a tuple, list (an index) or dict (a literal key) written out, else None."""
    if isinstance(value, (ast.Tuple, ast.List)) and type(key) is int and 0 <= key < len(value.elts):
        return value.elts[key]
    if isinstance(value, ast.Dict):
        found = [v for k, v in zip(value.keys, value.values) if isinstance(k, ast.Constant) and k.value == key]
        return found[0] if len(found) == 1 else None
    return None


def backward_target(source: str) -> str | None:
    """The tensor a line calls backward on: ``loss`` in ``loss.backward()``, ``scaler.scale(loss).backward()`` or
    ``autograd.grad(loss, ...)``.

    >>> backward_target("scaler.scale(loss).backward()"), backward_target("(a + b).backward()")
    ('loss', None)
    """
    match = _BACKWARD_SCALED.search(source) or _BACKWARD_ON.search(source) or _BACKWARD_OF.search(source)
    return match.group(1) if match else None


def optimizer_name(source: str) -> str:
    """``opt`` in ``opt.step()``; ``optimizer`` when the line does not say."""
    match = _CALL_ON.search(source)
    return match.group(1) if match else "optimizer"


def counted(n: int, word: str) -> str:
    """'1 step', '2 steps', '1,200 autograd nodes': a count with its noun in the right number.

    >>> counted(1, "autograd node"), counted(3, "step")
    ('1 autograd node', '3 steps')
    """
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def steps_text(steps: Iterable[int]) -> str:
    """'step 3', 'steps 1, 2', 'steps 0..6' or "the session's start" (step -1)."""
    named = sorted(set(steps))
    if not named:
        return "no step"
    words = ["before the session" if s < 0 else str(s) for s in named]
    if len(named) == 1:
        return "the session's start" if named[0] < 0 else f"step {words[0]}"
    return f"steps {words[0]}..{words[-1]}" if len(named) > 3 else "steps " + ", ".join(words)


def spans_text(spans: Iterable[Sequence[int]]) -> str:
    """Steps given as inclusive ``[first, last]`` spans, each as it is: 'step 3', 'steps 50..73', 'steps 0 and
    50..73', 'steps 4, 5' ("the session's start" for step -1, as :func:`steps_text` says it).

    >>> spans_text([[50, 73]]), spans_text([[0, 0], [50, 73]]), spans_text([[4, 5], [9, 9]]), spans_text([[-1, 2]])
    ('steps 50..73', 'steps 0 and 50..73', 'steps 4, 5 and 9', "the session's start and steps 0..2")
    """
    spans = [(int(first), int(last)) for first, last in spans]
    if spans and spans[0][0] < 0:
        rest = [(max(first, 0), last) for first, last in spans if last >= 0]
        return "the session's start" + (f" and {spans_text(rest)}" if rest else "")
    if not spans:
        return "no step"
    parts = [str(a) if a == b else f"{a}, {b}" if b == a + 1 else f"{a}..{b}" for a, b in spans]
    head = "step" if len(spans) == 1 and spans[0][0] == spans[0][1] else "steps"
    return f"{head} " + (parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}")


def step_name(step: int) -> str:
    """'step 3', or 'before the session' for step -1."""
    return "before the session" if step < 0 else f"step {step}"


def made_when(trace: Trace, step: int, made: CallSite | None, event: CallSite | None) -> str:
    """When a tensor was made, for "made at X {when}": "in step 3"; for one made in step 0 by a line that ran
    before the loop around the backward at ``event`` (in the function both lines' calls share, the line is
    before every loop there that holds the event's line), "before the loop at train.py:12", as the first step
    had not begun (the session counts step 0 from its start, set-up lines included); "before the session".

    >>> trace = Trace()
    >>> made_when(trace, 2, None, None), made_when(trace, -1, None, None)
    ('in step 2', 'before the session')
    """
    loop = _loop_after(trace, made, event) if step == 0 and made is not None and event is not None else None
    return f"before the loop at {loop}" if loop else ("before the session" if step < 0 else f"in step {step}")


def _loop_after(trace: Trace, made_site: CallSite, event_site: CallSite) -> str | None:
    """file:line of the outermost loop around the event's line, in the innermost function of the made line's
    chain that the event's chain runs too, when the made line there comes before that loop; else None."""
    events = [event_site, *site_chain(trace, event_site.caller)]
    for made in [made_site, *site_chain(trace, made_site.caller)]:
        event = next((e for e in events if (e.file, e.function) == (made.file, made.function)), None)
        if event is None:
            continue
        tree = module_node(made.file)
        if tree is None:
            return None
        scope = innermost_function(tree, event.line)
        loops = [n for n in ast.walk(scope or tree) if isinstance(n, (ast.For, ast.AsyncFor, ast.While))
                 and n.lineno <= event.line <= (n.end_lineno or n.lineno) and innermost_function(tree, n.lineno) is scope]  # fmt: skip
        outer = min(loops, key=lambda n: n.lineno, default=None)
        return f"{made.file}:{outer.lineno}" if outer is not None and made.line < outer.lineno else None
    return None


def describe_site(trace: Trace, site_id: int | None) -> str:
    """'train.py:18 (`h = cell(x, h)`)' or '<unknown line>'."""
    return describe(trace.site(site_id))


def describe(site: CallSite | None) -> str:
    """Like :func:`describe_site`, for a CallSite."""
    if site is None:
        return "<unknown line>"
    return f"{site.where} (`{site.source}`)" if site.source else site.where


def site_chain(trace: Trace, site_id: int | None) -> list[CallSite]:
    """The site and the user frames that called it, innermost first."""
    chain = []
    while site_id is not None:
        site = trace.sites[site_id]
        chain.append(site)
        site_id = site.caller
    return chain


def outermost_assignment(trace: Trace, site_id: int | None) -> tuple[CallSite | None, str | None]:
    """The innermost site in the chain that assigns a variable, and that variable.

    For ``h = cell(x, h)`` calling a user module's ``return torch.tanh(...)``,
    the call line names the carried tensor better than the line inside.
    """
    for site in site_chain(trace, site_id):
        name = assigned_name(site.source)
        if name is not None:
            return site, name
    return trace.site(site_id), None


def backwards_of(trace: Trace, step: StepRecord) -> list[BackwardRecord]:
    """The backward calls made during ``step``."""
    return [trace.backwards[i] for i in step.backwards]


def backward_name(trace: Trace, backward: BackwardRecord, default: str) -> str:
    """The tensor ``backward`` was called on, as the user's line spells it, else ``default``."""
    site = trace.site(backward.site)
    return (backward_target(site.source) if site else None) or default


def same_line(trace: Trace, a: int | None, b: int | None) -> bool:
    """True when two site ids are the same line of the same file."""
    return a is not None and b is not None and trace.where(a) == trace.where(b)


def line_runs_in(trace: Trace, where: str, step: int) -> bool:
    """True if some node created in ``step`` was made at ``where`` (a line the loop runs again).

    Only nodes whose line was seen (not inferred from a neighbour) count.  The
    newest records are read, until ``_NEAR`` in a row belong to other steps.
    """
    others = 0
    for node in reversed(trace.nodes.values()):
        if node.step != step:
            others += 1
            if others > _NEAR:
                return False
            continue
        others = 0
        if not node.site_inferred and node.site is not None:
            site, _ = outermost_assignment(trace, node.site)
            if site is not None and site.where == where:
                return True
    return False


def carrier_line(trace: Trace, carrier: NodeRecord) -> tuple[CallSite | None, str | None]:
    """The line that assigns the value whose graph crosses steps, and its name.

    The name the training loop's frame gave it when graphwatch saw the crossing
    (``hidden``, ``self.target``) wins, with the loop's line that assigns it (for an
    attribute: the line of the node's call chain that assigns it); else the
    innermost line of the node's call chain that assigns a variable, when that is the node's own line (one
    read off the last op before it that saved a tensor, ``site_inferred``, may assign something else: no name,
    no line then).
    """
    name = carrier.carried_as
    if name is None:
        return outermost_assignment(trace, carrier.site) if not carrier.site_inferred else (None, None)
    if carrier.carried_kind == "parameters":  # the line of the in-place update, when the source has one
        return trace.site(carrier.carried_at), name
    if carrier.carried_at is not None:  # (the line of a class that stores it spells it `self.target`)
        site = trace.sites[carrier.carried_at]
        return site, _spelled(site, name) or name
    for site in site_chain(trace, carrier.site):  # the line that assigns the attribute names it its way
        spelled = _spelled(site, name)
        if spelled:
            return site, spelled
    return trace.site(carrier.site), name


def _spelled(site: CallSite, name: str) -> str | None:
    """How ``site``'s line spells the attribute ``name`` (dotted) it assigns: ``name`` itself, else the one
    assigned with the same last attribute (``self.target`` for ``content.target``); None for a plain name."""
    if "." not in name:
        return None
    assigned = assigned_names(site.source)
    if name in assigned:
        return name
    attr = name.rsplit(".", 1)[-1]
    return next((n for n in assigned if n.endswith(f".{attr}")), None)


def carried_pattern(trace: Trace, carrier: NodeRecord, site: CallSite | None, backward: BackwardRecord) -> str:
    """"recurrent" when the loop feeds each step's new value on, "cached" when one value is reused.

    A value the loop's frame still held while the step ran (seen as the very node, so "cached") is fed back
    all the same when the line that assigns it is the one running the step: ``loss, hidden =
    train_step(model, x, hidden)`` holds the last step's ``hidden`` until ``train_step()`` returns the new one.
    """
    if carrier.carried_kind in ("cached", "constant") and site is not None:
        if any(s.where == site.where for s in site_chain(trace, backward.site)):
            return "recurrent"
    if carrier.carried_kind is not None:  # (a buffer renewed each step is fed back: its own fix, recurrent words)
        return {"constant": "cached", "buffer": "recurrent"}.get(carrier.carried_kind, carrier.carried_kind)
    return "recurrent" if site is not None and line_runs_in(trace, site.where, backward.step) else "cached"


def use_line(trace: Trace, user: NodeRecord | None, name: str | None) -> CallSite | None:
    """The line of ``user``, the node of this step that used the carried value ``name``.  A line inferred from
    the op before it (its own op saved no tensor: ``NodeRecord.site_inferred``) may be another statement's, the
    one before the use; it is kept only where it reads the value (its last dotted part, as text)."""
    site = trace.site(user.site) if user is not None else None
    if site is None or user is None or not user.site_inferred:
        return site
    return site if name and name.split(".")[-1].split("[")[0] in site.source else None


def alive_graph_sites(trace: Trace, steps: Iterable[int], limit: int = 3) -> list[str]:
    """'file:line' of the lines whose saved tensors from ``steps`` are still alive, most first."""
    wanted = set(steps)
    counts: dict[str, int] = {}
    for record in trace.saved.values():
        if record.alive and record.step in wanted and record.site is not None:
            where = trace.where(record.site)
            counts[where] = counts.get(where, 0) + max(record.nbytes, 1)
    return sorted(counts, key=lambda w: -counts[w])[:limit]
