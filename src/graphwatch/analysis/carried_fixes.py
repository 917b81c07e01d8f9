"""Remedies for a graph carried from one step into the next by a value the loop keeps.

Four shapes, told apart by what ran (:func:`carried_shape`):

- ``recurrent``: the loop feeds each step's new value back in (an RNN's hidden state, also when a
  ``train_step()`` returns it to the loop).  The fix detaches the state where each step starts using it,
  as it ran: a tensor with ``.detach()``, an LSTM's ``(h, c)`` element by element, a state that starts as
  None only when it is not None (``detach-state``); it goes in the loop that leads to the backward, or first
  in the function that keeps the state when that function runs once per step (a ``training_step``);
- ``cached``: one value made in an earlier step is used again; what made it is trained, so whether it
  should be detached is the user's call (the detach where it is made is offered, not patched);
- ``constant``: cached, and made from nothing an optimizer trains (a style target): detached where it is
  made (``detach-made``);
- ``parameters``: a module's parameters updated in place outside ``no_grad`` (an EMA teacher whose outputs
  the loss uses): the update under ``no_grad`` (``no-grad``), patched when the backward that ran into the old
  graph failed.

A registered buffer renewed each step outside ``no_grad`` (a running statistic, ``self.running_mean = 0.9 *
self.running_mean + 0.1 * x.mean(0)``) is fed back as a recurrent state is, but it holds state no optimizer
trains: its fix stores it without its graph where the module renews it (:func:`_buffer_remedy`), offered, not
patched (whether this step's gradient should flow through the new value is the user's call).

The detector of graphs carried across steps and the explanation of a backward through a freed graph both
take their fixes from :func:`carried_remedies`, through :func:`remedies_for_all` where a backward ran into the
graphs of several values (two tensors kept from before the loop): one fix for all of them, or no patch.

Example::

    >>> from graphwatch.model import BackwardRecord, NodeRecord, Trace
    >>> carrier = NodeRecord(id=0, op="TanhBackward0", step=0, seq=1, carried_as="h", carried_kind="recurrent")
    >>> first, second = carried_remedies(Trace(), carrier, BackwardRecord(0, 1, None, "backward", False, False))
    >>> first.text.split(" (")[0], first.patchable  # (the value's type was not recorded: no edit)
    ('detach `h` at the start of each step', False)
    >>> second.text
    'or, if the state need not carry over, start each step from a fresh `h` made inside the step (this drops the state)'
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..capture.lines.source import assigned_names
from ..model import BackwardRecord, CallSite, Edit, NodeRecord, Remedy, Trace
from .evidence import carried_pattern, carrier_line, made_when, site_chain
from .kept_fixes import _file_source, parameters_remedy

if TYPE_CHECKING:
    import libcst as cst

# .codemods (LibCST) is imported inside the functions that use it: not at `import graphwatch` (test_import_cost.py)

_TBPTT = "(keeps the value, cuts the graph: truncated backpropagation through time)"


def carried_shape(trace: Trace, carrier: NodeRecord, backward: BackwardRecord) -> str:
    """"recurrent", "cached" or "constant" (see the module's doc) for the value that carried ``carrier``."""
    site, _ = carrier_line(trace, carrier)
    pattern = carried_pattern(trace, carrier, site, backward)
    return "constant" if pattern == "cached" and carrier.carried_kind == "constant" else pattern


def carried_remedies(
    trace: Trace, carrier: NodeRecord, backward: BackwardRecord, used_where: str | None = None
) -> list[Remedy]:
    """The fixes, best first, for the graph ``carrier`` (a node of an earlier step) carried into ``backward``;
    ``used_where``: the line of this step that uses the value."""
    site, name = carrier_line(trace, carrier)
    if carrier.carried_kind == "buffer":
        return [_buffer_remedy(carrier, name, site)]
    shape = carried_shape(trace, carrier, backward)
    if shape == "parameters":
        return [_update_under_no_grad(trace, name or "", site, backward)]
    tensor = f"`{name}`" if name else "the tensor"
    if shape == "recurrent":
        module, kept, name = _state_file(site, name)
        fresh = f"`{name}`" if name else "the tensor"
        return [_detach_state(trace, carrier, backward, (site, kept), name, module),
                Remedy(f"or, if the state need not carry over, start each step from a fresh {fresh} made inside "
                       "the step (this drops the state)")]  # fmt: skip
    used = used_where or trace.where(backward.site)
    compute = f"compute {tensor} inside the step that uses it ({used})"
    made = _detach_made(carrier, site, name, trusted=shape == "constant")
    if shape == "constant":
        return [made, Remedy(f"or {compute}")]
    when = made_when(trace, carrier.step, site, trace.site(backward.site))  # "in step 0", "before the loop at ..."
    return [Remedy(f"{compute} instead of keeping it from {when.removeprefix('in ')}"), made]


def crossing_carriers(trace: Trace, backward: BackwardRecord, first: NodeRecord) -> list[NodeRecord]:
    """``first`` and the carriers of the backward's other crossings that are other values (two tensors kept
    from step 0, each used again): one per name (or, unnamed, per line) that carries it, never one the first
    carries with it (an LSTM's ``(h, c)``, detached together)."""
    carriers, seen = [first], {carrier_line(trace, first)[1] or "", *first.carried_with}
    for _, child in backward.crossings:
        carrier = trace.nodes.get(child)
        if carrier is None or carrier.id == first.id:
            continue
        site, name = carrier_line(trace, carrier)
        key = name or (site.where if site is not None else f"node {carrier.id}")
        if key not in seen:
            seen.add(key)
            carriers.append(carrier)
    return carriers


def remedies_for_all(
    trace: Trace, carriers: list[NodeRecord], backward: BackwardRecord, used_where: str | None = None
) -> list[Remedy]:
    """:func:`carried_remedies` of one carrier; of several, one fix that cuts every one of them (each one's first
    fix, together), patched only when each of those is; else the fixes of each, named, and no patch (a patch
    that cut one would leave the others carrying the graph).  A patch that detaches every carrier where it is
    made also drops a ``retain_graph=True`` that only kept the graph for them (:func:`_retain_dropped`)."""
    first = carried_remedies(trace, carriers[0], backward, used_where)
    if len(carriers) == 1:
        return [_retain_dropped(trace, first[0], backward), *first[1:]]
    each = [first[0], *(carried_remedies(trace, carrier, backward)[0] for carrier in carriers[1:])]
    names = [f"`{name}`" if (name := carrier_line(trace, carrier)[1]) else "a tensor with no name" for carrier in carriers]
    carried = f"{', '.join(names[:-1])} and {names[-1]} each carry an earlier step's graph into this one"
    text = f"{carried}; fix each: " + "; ".join(f"({i}) {remedy.text}" for i, remedy in enumerate(each, 1))
    edits = [edit for remedy in each for edit in remedy.edits]
    if all(remedy.patchable for remedy in each):
        why = "; ".join(remedy.why for remedy in each if remedy.why)
        return [_retain_dropped(trace, Remedy(text, edits, why=why, mechanical=True), backward)]
    unsafe = ", ".join(names[i] for i, remedy in enumerate(each) if not remedy.patchable)
    text += f" (no patch: the fix of {unsafe} needs your judgement, and a patch of the others alone would leave it)"
    return [Remedy(text, edits)]


def _retain_dropped(trace: Trace, remedy: Remedy, backward: BackwardRecord) -> Remedy:
    """``remedy``, which detaches every carrier where it is made, with the ``retain_graph=True`` of ``backward``
    dropped too when that only kept the graph for the carriers: the backward's line never ran beside another
    backward in a step (nor twice in one), so once no value carries the graph on, nothing needs it again (kept,
    a retain for nothing would remain).  ``remedy`` unchanged otherwise."""
    site = trace.site(backward.site)
    if not (remedy.patchable and backward.retain_graph and site is not None):
        return remedy
    if any(edit.kind != "detach-made" for edit in remedy.edits):
        return remedy  # (a state detached each step drops it itself, where that is safe: _detach_state)
    steps = [b.step for b in trace.backwards if trace.where(b.site) == site.where]
    alone = all(b.step not in steps or trace.where(b.site) == site.where for b in trace.backwards)
    if not alone or len(steps) != len(set(steps)):
        return remedy
    text = f"{remedy.text}; then drop `retain_graph=True` at {site.where}: no other backward of its step needs the graph"
    why = f"{remedy.why}; the backward at {site.where} is the only one of each step it ran in"
    return Remedy(text, [*remedy.edits, Edit("drop-retain", site.file, site.line)], why=why, mechanical=True)


def carried_detach(trace: Trace, carrier: NodeRecord, backward: BackwardRecord) -> str | None:
    """The statement that detaches the value carrying ``carrier`` into ``backward``, as the fixes of
    :func:`carried_remedies` write it (the script's own helper, the holder as the file spells it, the value
    detached where it is made): what the finding's words name is what its patch does.  None when no fix
    detaches it (parameters updated in place) or no statement can be written."""
    site, name = carrier_line(trace, carrier)
    shape = "buffer" if carrier.carried_kind == "buffer" else carried_shape(trace, carrier, backward)
    if shape == "recurrent":
        module, _, name = _state_file(site, name)
        return _state_detach(carrier, name, module)[1]
    made = _made_detached(carrier, site, name, _BUFFER_TYPE if shape == "buffer" else None) if shape != "parameters" else None
    return made[1] if made is not None else None


def _buffer_remedy(carrier: NodeRecord, name: str | None, store: CallSite | None) -> Remedy:
    """A module's buffer renewed each step outside ``no_grad`` carries the graph: store it without its graph where
    the module renews it (``store``, the line that assigns it), as the line would read detached."""
    buffer = f"`{name}`" if name else "the buffer"
    if store is None:
        return Remedy(f"renew {buffer} under `with torch.no_grad():` (or store it `.detach()`ed) where the module "
                      f"updates it ({_BUFFER_WHY})")  # fmt: skip
    made = _made_detached(carrier, store, name, _BUFFER_TYPE)
    how = f": `{made[1]}`" if made is not None else " (`.detach()` the value, or renew it under `torch.no_grad()`)"
    return Remedy(f"store {buffer} without its graph where the module renews it, at {store.where}{how} ({_BUFFER_WHY})")


_BUFFER_TYPE = "Tensor"  # what a registered buffer's store assigns, whatever else the code sets it to
_BUFFER_WHY = (
    "a buffer holds state no optimizer trains, as `BatchNorm` renews its running statistics under `torch.no_grad()`; "
    "whether this step's gradient should flow through the new value is your call, so no patch"
)


def _update_under_no_grad(trace: Trace, holder: str, update: CallSite | None, backward: BackwardRecord) -> Remedy:
    """A module's parameters updated in place outside ``no_grad`` carry the graph: the update under ``no_grad``,
    patched where the backward that ran into the old graph failed (its step could not train; a backward that
    ran through and trained would train differently without that graph: then no patch)."""
    module = holder[: -len(".parameters()")] if holder.endswith(".parameters()") else "the module"
    if backward.error is None or update is None:
        return parameters_remedy(trace, module, None)
    why = (
        f"the parameters keep their values under no_grad; the update at {update.where} stops recording the graph "
        "that the next step's backward ran into after its own step had freed it (the error)"
    )
    return parameters_remedy(trace, module, update, why=why)


def _state_file(site: CallSite | None, name: str | None) -> tuple[cst.Module | None, CallSite | None, str | None]:
    """The file holding the state's line (None: unread), and where and how it keeps the state (:func:`_kept_where`)."""
    from .codemods import file_tree

    source = _file_source(site) if site is not None else None
    module = file_tree(source).module if source is not None else None
    if site is None or name is None or module is None:
        return module, site, name
    return (module, *_kept_where(site, name, module))


def _detach_state(
    trace: Trace,
    carrier: NodeRecord,
    backward: BackwardRecord,
    sites: tuple[CallSite | None, CallSite | None],
    name: str | None,
    module: cst.Module | None,
) -> Remedy:
    """The detach of a state the loop carries, placed where each step starts using it; ``sites``: the line as it
    ran (where a step starts is read off it) and the line that keeps the state, as the file spells it."""
    from .codemods.detach import HELPER_NAME, loop_holds_both

    ran, site = sites
    value_type = carrier.carried_type or ""
    target, statement, added = _state_detach(carrier, name, module)
    before = f", before {site.where}" if site is not None else ""
    if statement is None or site is None or ran is None or target is None:
        what = f"`{name}`" if name else "the tensor the step carries over"
        kind = f" (it held {_described(value_type)}: detach each tensor in it)" if value_type == "other" else ""
        return Remedy(f"detach {what} at the start of each step{before}{kind} {_TBPTT}")
    until = _line_towards(trace, backward, ran)
    if until is not None and module is not None and not loop_holds_both(module, site.line, until):
        until = None  # the backward's function runs once per backward (`self.manual_backward(loss)`, a train_step())
    text = f"`{statement}` at the start of each step{before} {_TBPTT}"
    runs = _runs_per_step(trace, carrier, ran) if until is None else 1
    span = _function_span(module, site.line) if runs == 0 and module is not None else None
    if runs == 0 and (span is None or _runs_per_step(trace, carrier, ran, span) <= 1):
        return Remedy(text)  # a plain store made no node: how often it runs, so where a step starts, is unknown
    if runs != 1:
        # the function holding it runs more than once a step (a neuron's forward, once per time step)
        return Remedy(f"`{statement}` once at the start of each step, on the object that holds `{target}`, before "
                      f"the step's first call of `{site.function}` (not inside it: it stores the state at "
                      f"{site.where} more than once a step) {_TBPTT}")  # fmt: skip
    edits = [Edit("detach-state", site.file, site.line, target, until=until, value_type=value_type)]
    backward_site = trace.site(backward.site)
    if backward.retain_graph and not backward.graph_reused and backward_site is not None:
        edits.append(Edit("drop-retain", backward_site.file, backward_site.line))
        text += f"; then drop `retain_graph=True` at {backward_site.where}: no backward needs the graph again"
    placed = (
        f"in the loop that leads to the backward at {trace.where(backward.site)}"
        if until is not None
        else f"first in `{site.function}`, which ran once per step"
    )
    why = f"`{target}` held {_described(value_type)} when the step used it; the detach goes {placed}"
    if statement.endswith(f"({target})"):
        helper = statement.rsplit(" = ", 1)[-1].split("(")[0]
        why += f"; the script's own `{helper}` detaches it" if not added else (
            f"; the script makes `{target}` a tuple in one place and a tensor in another: `{helper}` detaches either"
        )
        if added:
            text += f" (`{HELPER_NAME}`, added to the file, detaches a tensor and tuples of them alike)"
    return Remedy(text, edits, why=why, mechanical=True)


def _state_detach(
    carrier: NodeRecord, name: str | None, module: cst.Module | None
) -> tuple[str | None, str | None, bool]:
    """(the state a step carries, as the file ``module`` spells it, the statement that detaches it or None,
    whether the helper :data:`~.codemods.detach.HELPER_NAME` must be added for it)."""
    from .codemods.detach import state_statement

    target = ", ".join(carrier.carried_with) if carrier.carried_with else name
    value_type = carrier.carried_type or ""
    statement, added = state_statement(module, target, value_type) if target and value_type else (None, False)
    return target, statement, added


def _made_detached(
    carrier: NodeRecord, site: CallSite | None, name: str | None, value_type: str | None = None
) -> tuple[Edit, str] | None:
    """(the edit that detaches ``name`` where ``site`` makes it, the statement it makes), or None (``value_type``:
    the type the edit detaches, when not the carried value's as it ran)."""
    from .codemods.expressions import edited_statement

    if site is None or not name:
        return None
    edit = Edit("detach-made", site.file, site.line, name, value_type=value_type or carrier.carried_type or "other")
    edited = edited_statement(edit, site.source)
    return (edit, edited) if edited is not None else None


def _detach_made(carrier: NodeRecord, site: CallSite | None, name: str | None, trusted: bool) -> Remedy:
    """Keep a detached copy where the value is made: the patch when what made it is not trained (``trusted``),
    advice otherwise (the user knows whether a gradient should flow there).  The copy is spelled as the value's
    type ran: a list of tensors detached item by item, never ``.detach()`` on the list."""
    from .codemods.detach import detached

    value = detached(name, carrier.carried_type or "other") if name else None
    copy = f"`{value}`" if value else "`.detach()` on each tensor in it" if name else "`.detach()`"
    edits: list[Edit] = []
    where = site.where if site is not None else "the line that makes it"
    made = _made_detached(carrier, site, name)
    if site is not None and made is not None:
        edits, where = [made[0]], f"{site.where}, `{made[1]}`"
    if not trusted:
        return Remedy(f"or keep a detached copy ({copy} where it is made: {where}) if no gradient should flow into "
                      "what made it", edits)  # fmt: skip
    why = "no parameter an optimizer steps is reached from its graph (checked when the backward ran into it)"
    text = f"keep a detached copy: {copy} where it is made ({where}); what made it is not trained, so no gradient needs to flow there"
    return Remedy(text, edits, why, mechanical=bool(edits))


def _kept_where(site: CallSite, name: str, module: cst.Module) -> tuple[CallSite, str]:
    """Where the function holding ``site`` keeps the attribute ``name`` names, as it spells it: a KV cache on a
    submodule, seen as ``self.cache_k``, kept by the outer model's ``self.attn.cache_k = torch.cat([...])``
    (``site`` and ``name`` unchanged when the line assigns it already, or the function does not)."""
    from .codemods.detach import attribute_assignment

    head, _, attr = name.partition(".")
    if head != "self" or "." in attr or name in assigned_names(site.source):
        return site, name
    found = attribute_assignment(module, site.line, attr)
    if found is None:
        return site, name
    line, spelled = found
    return replace(site, line=line, source=module.code.splitlines()[line - 1]), spelled


def _line_towards(trace: Trace, backward: BackwardRecord, site: CallSite) -> int | None:
    """The line of ``site``'s function on the backward's call chain (the backward's own line, or the call
    that leads to it, as ``train_step(...)``), or None when that function is not on it."""
    return next((s.line for s in site_chain(trace, backward.site) if (s.file, s.function) == (site.file, site.function)), None)


def use_in_step(trace: Trace, user: NodeRecord | None, backward: BackwardRecord) -> CallSite | None:
    """The line of the backward's function that leads to ``user`` (the node of this step that used the carried
    value): ``output, hidden = model(x, hidden)`` in a ``train_step()`` whose ``loss.backward()`` ran into the
    last step's ``hidden`` inside ``forward``; None when the use is not below that function's lines."""
    if user is None or user.site is None or trace.site(backward.site) is None:
        return None
    inner = site_chain(trace, backward.site)[0]
    return next((s for s in site_chain(trace, user.site) if (s.file, s.function) == (inner.file, inner.function)), None)


def _runs_per_step(trace: Trace, carrier: NodeRecord, site: CallSite, span: tuple[int, int] | None = None) -> int:
    """How many times ``site``'s line (or, given ``span``, the lines of its function) ran in the carrier's step,
    as the fewest nodes one op made there: 1 for a ``training_step``'s line (an LSTM's one layer node, beside its
    two stacks), more for a cell's line run once per time step; 0 when no op made a node there (a plain store)."""
    def there(s: CallSite) -> bool:
        return s.file == site.file and span[0] <= s.line <= span[1] if span else s.where == site.where

    made: dict[str, int] = {}
    for node in trace.nodes.values():
        if node.step == carrier.step and node.site is not None and any(map(there, site_chain(trace, node.site))):
            made[node.op] = made.get(node.op, 0) + 1
    return min(made.values(), default=0)


def _function_span(module: cst.Module, line: int) -> tuple[int, int]:
    """The first and last line of the innermost function holding ``line`` (the whole file when none does)."""
    import libcst as cst

    from .codemods import module_tree

    tree = module_tree(module)
    functions = tree.holding(line, cst.FunctionDef)
    if not functions:
        return 1, len(module.code.splitlines())
    span = tree.span(functions[-1])
    return span.start.line, span.end.line


def _described(value_type: str) -> str:
    """'a tensor', 'a tuple of tensors', 'None at first, then a tuple of tensors', ..."""
    if value_type.startswith("Optional[") and value_type.endswith("]"):
        return f"None at first, then {_described(value_type[len('Optional['):-1])}"
    for prefix in ("tuple[", "list["):
        if value_type.startswith(prefix) and value_type.endswith("]"):
            inner = _described(value_type[len(prefix) : -1]).split(" ", 1)[-1]
            return f"a {prefix[:-1]} of {inner if inner.endswith('s') else inner + 's'}"
    return "a tensor" if value_type == "Tensor" else "a value of another kind"
