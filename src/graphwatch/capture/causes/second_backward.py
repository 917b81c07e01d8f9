"""At a "backward through the graph a second time" error: what the fix must come from.

Looked at once, at the error, while the failing backward's graph, the freeing
backward's graph (when its loss is still alive) and the user's frames are
there:

- which optimizer steps after each of the two backwards
  (:mod:`~graphwatch.capture.causes.ownership`), and which parameters each owns;
- where a loss reaches parameters that its optimizer does not own, through a
  tensor made from another optimizer's parameters only: a *cut*
  (:class:`~graphwatch.model.causes.Cut`), named as the line that uses it
  spells it, on the line of the function running the backward where that loss
  uses it (a GAN's ``netD(fake)`` in D's step, never G's);
- the tensor both backwards reach, the value holding it (a variable, or an
  attribute of an object the frames reach: ``self.target``), the line that
  ran and assigned it, and who owns what made it;
- whether the failing loss is made from an ``autograd.grad`` result (force
  matching), from the syntax tree of the function that ran both.

Example::

    >>> from graphwatch.capture.causes.second_backward import graph_flags
    >>> import torch
    >>> w, v = torch.ones(2, requires_grad=True), torch.ones(2, requires_grad=True)
    >>> loss = (w * 2 + v.exp()).sum()
    >>> flags, _, _ = graph_flags([loss.grad_fn], owned={id(w)}, foreign={id(v)})
    >>> flags[loss.grad_fn], flags[loss.grad_fn.next_functions[0][0].next_functions[1][0]]  # both / only v's
    (3, 2)
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from types import FrameType
from typing import TYPE_CHECKING, Any

import torch

from ...model import BackwardRecord, CallSite, NodeRecord
from ...model.causes import BackwardCause, Cut
from ..graph.graph_walk import node_record
from ..graph.node_types import saved_handles
from ..lines.callsite import display_path
from ..lines.source import dotted_name, function_node
from .carriers import holders_of
from .ownership import (
    optimizer_stepping_after,
    optimizers_in_frames,
    owners,
    parameter_ids,
    resolve,
    stepping_optimizer,
)

if TYPE_CHECKING:
    from ..recorder import Recorder

OWNED, FOREIGN = 1, 2
_LIMIT = 200_000  # nodes looked at per graph


def graph_flags(
    roots: Iterable[Any], owned: set[int], foreign: set[int], limit: int = _LIMIT
) -> tuple[dict[Any, int], dict[Any, list[Any]], set[int]]:
    """(node -> OWNED | FOREIGN bits of the parameters below it, node -> its children, ``id()`` of every
    parameter reached) for the graph below ``roots``: AccumulateGrad nodes count as the parameter's."""
    children: dict[Any, list[Any]] = {}
    order: list[Any] = []
    stack = [(root, False) for root in roots if root is not None]
    reached: set[int] = set()
    flags: dict[Any, int] = {}
    while stack and len(children) < limit:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if node in children:
            continue
        variable = getattr(node, "variable", None)
        if variable is not None:
            reached.add(id(variable))
            flags[node] = (OWNED if id(variable) in owned else 0) | (FOREIGN if id(variable) in foreign else 0)
            children[node] = []
            continue
        kids = children[node] = [child for child, _ in node.next_functions if child is not None]
        stack.append((node, True))
        stack.extend((child, False) for child in kids if child not in children)
    for node in order:  # children before parents
        bits = 0
        for child in children[node]:
            bits |= flags.get(child, 0)
        flags[node] = bits
    return flags, children, reached


class CauseFinder:
    """Gathers a :class:`~graphwatch.model.causes.BackwardCause` for one failed backward.

    ``stepped_after(backward_id)``: the optimizers that stepped first after that backward (history);
    ``freeing_roots``: the freeing backward's root nodes, if its loss is still alive; ``freeing_params``:
    ``id()`` of the parameters it reached, as recorded when it ran.
    """

    def __init__(self, recorder: Recorder, start: FrameType | None,
                 stepped_after: Callable[[int], list[torch.optim.Optimizer]]) -> None:
        self.recorder = recorder
        self.trace = recorder.trace
        self.stepped_after = stepped_after
        self.frames = _user_frames(start)
        self.frame = self.frames[0] if self.frames else None  # the frame that runs the failing backward
        named = optimizers_in_frames(start)
        stepping = stepping_optimizer(start)
        self.closure = stepping
        self.names: dict[int, str] = {id(o): n for n, o in named}
        self.optimizers: list[torch.optim.Optimizer] = [o for _, o in named]
        self._flags: dict[Any, int] = {}  # the graph looked at now: node -> OWNED | FOREIGN
        self._add(stepping)

    def _add(self, optimizer: torch.optim.Optimizer | None) -> str:
        if optimizer is None:
            return ""
        if id(optimizer) not in self.names:
            self.names[id(optimizer)] = type(optimizer).__name__
            self.optimizers.append(optimizer)
        return self.names[id(optimizer)]

    # ------------------------------------------------------------------ optimizers
    def optimizer_of(self, backward: BackwardRecord, failing: BackwardRecord) -> torch.optim.Optimizer | None:
        """The optimizer that steps after ``backward``: the first one that stepped after it (before the
        failing one); else the one whose closure runs now, when both run in it; else the first step after
        its line in the source of the frame running it."""
        after = [o for o in self.stepped_after(backward.id) if o is not None]
        if after and backward.id < failing.id:
            return after[0]
        site = self.trace.site(backward.site)
        if self.frame is None or site is None or not _runs_in(site, self.frame):
            return None
        if self.closure is not None:
            return self.closure
        for earlier in reversed(self.trace.backwards[: backward.id]):  # the same line in an earlier step
            if earlier.site is not None and self.trace.where(earlier.site) == site.where:
                before = [o for o in self.stepped_after(earlier.id) if o is not None]
                if before:
                    return before[0]
                break
        found = optimizer_stepping_after(self.frame, site.line)
        return None if found is None else found[1]

    # ------------------------------------------------------------------ the cause
    def cause(
        self, freeing: BackwardRecord, failing: BackwardRecord, roots: list[Any], shared: NodeRecord | None,
        freeing_roots: list[Any], freeing_params: frozenset[int] | None,
    ) -> BackwardCause:
        cause = BackwardCause()
        optimizers = {b.id: self.optimizer_of(b, failing) for b in (freeing, failing)}
        for optimizer in optimizers.values():
            self._add(optimizer)
        for optimizer in (o for b in range(freeing.id, failing.id) for o in self.stepped_after(b)):
            name = self._add(optimizer)
            if name and name not in cause.stepped_between:
                cause.stepped_between.append(name)
        cause.optimizers = {i: self.names[id(o)] if o is not None else "" for i, o in optimizers.items()}
        cause.optimizers_seen = list(dict.fromkeys(self.names.values()))
        owned_by = owners((self.names[id(o)], o) for o in self.optimizers)
        reached: dict[int, set[int]] = {}
        nodes: dict[int, Any] = {}
        for backward, graph in ((failing, roots), (freeing, freeing_roots)):
            if not graph:
                continue
            optimizer = optimizers[backward.id]
            mine = parameter_ids(optimizer) if optimizer is not None else set()
            theirs = set(owned_by) - mine if optimizer is not None else set()
            flags, children, reached[backward.id] = graph_flags(graph, mine, theirs)
            if backward is failing:
                nodes = {r.id: n for n in children if (r := node_record(n)) is not None}
            if optimizer is not None:
                cause.cuts += self._cuts(backward, flags, children, owned_by, cause.optimizers[backward.id])
        if freeing.id not in reached and freeing_params is not None:
            reached[freeing.id] = set(freeing_params)
        self._shared(cause, shared, nodes.get(shared.id) if shared is not None else None, owned_by, optimizers)
        self._one_owner(cause, reached, owned_by, optimizers, freeing, failing)
        cause.grad_result = self._grad_result(freeing, failing)
        return cause

    def _cuts(self, backward: BackwardRecord, flags: dict[Any, int], children: dict[Any, list[Any]],
              owned_by: dict[int, str], optimizer: str) -> list[Cut]:
        """The tensors made from other optimizers' parameters only that this backward's loss uses."""
        site = self.trace.site(backward.site)
        frame = self.frame if site is not None and self.frame is not None and _runs_in(site, self.frame) else None
        cuts: dict[int, Cut] = {}
        for parent, kids in children.items():
            if not flags.get(parent, 0) & OWNED:
                continue
            for child in kids:
                if flags.get(child) != FOREIGN or getattr(child, "variable", None) is not None:
                    continue
                self._flags = flags
                cut = self._cut(backward, parent, child, site, frame, owned_by, optimizer)
                if cut is not None and (cut.used_at, cut.name) not in {(c.used_at, c.name) for c in cuts.values()}:
                    cuts[len(cuts)] = cut
        return list(cuts.values())

    def _cut(self, backward: BackwardRecord, parent: Any, child: Any, site: CallSite | None,
             frame: FrameType | None, owned_by: dict[int, str], optimizer: str) -> Cut | None:
        if site is None:
            return None
        where = (site.file, site.function)
        use_site = self._node_site(parent)
        used = self.trace.site(_line_in(self.trace, use_site, where))
        name = None
        if used is not None and frame is not None:  # the tensor, or what a module's own view of it was made of
            for below in _single_chain(child, flags_of=self._flags):
                name = _name_on_line(frame, used.line, below)
                if name is not None:
                    child = below
                    break
        innermost = self.trace.site(use_site)
        written_here = innermost is not None and (innermost.file, innermost.function) == where
        if name is None and (not written_here or _views_a_parameter(child)):  # ``weight.t()`` in a Linear
            return None
        made = _line_in(self.trace, self._node_site(child), where)
        made_site = self.trace.site(made)
        if made_site is not None and name is not None and frame is not None and used is not None \
                and not self._exact(child):  # fmt: skip
            made = self._assignment_between(frame, name, made_site, used)
        owner = next((owned_by[p] for p in _leaves(child) if p in owned_by), None)
        return Cut(backward.id, name, _line_in(self.trace, use_site, where), made, optimizer, owner)

    def _exact(self, node: Any) -> bool:
        """Whether ``node``'s line is its own (it saved a tensor), not the one of the last op that did."""
        record = node_record(node)
        return (record is not None and record.site is not None and not record.site_inferred) or any(
            True for _ in saved_handles(node)
        )

    def _assignment_between(self, frame: FrameType, name: str, after: CallSite, used: CallSite) -> int | None:
        """The one line of ``frame``'s function that assigns ``name`` after the line ``after`` (the last op
        before the tensor's, which ran) and up to ``used`` (which ran after it): where the tensor was made."""
        tree = function_node(frame.f_code)
        lines = sorted({s.lineno for s in ast.walk(tree) if isinstance(s, ast.stmt) and not hasattr(s, "body")
                        and after.line <= s.lineno <= used.line and name in _stored(s)}) if tree else []  # fmt: skip
        if len(lines) != 1:
            return None
        return self.recorder.sites.from_frame(frame, lines[0])

    def _node_site(self, node: Any) -> int | None:
        """The line that made ``node``: its record's, its saved tensors', else the clock's."""
        record = node_record(node)
        if record is not None and record.site is not None:
            return record.site
        for handle in saved_handles(node):
            return handle.site
        return self.recorder.clock.site_of(node._sequence_nr())

    # ------------------------------------------------------------------ the shared tensor
    def _shared(self, cause: BackwardCause, shared: NodeRecord | None, node: Any, owned_by: dict[int, str],
                optimizers: dict[int, torch.optim.Optimizer | None]) -> None:
        if shared is None or node is None:
            return
        below = {p for p in _leaves(node) if p in owned_by}
        serving = {self.names[id(o)] for o in optimizers.values() if o is not None}
        owned = {owned_by[p] for p in below}
        cause.shared_owner = "nobody" if not owned else ("one" if owned <= serving and len(owned) == 1 else "other")
        held = holders_of(self.frames[0] if self.frames else None, node)
        for name, attr in sorted(held, key=lambda h: (h[0].count("."), h[0])):
            site = _assigning_site(self.trace, shared.site, name, attr)
            if site is not None:
                cause.shared, cause.shared_at = site
                return
        if held:
            cause.shared = held[0][0]

    def _one_owner(self, cause: BackwardCause, reached: dict[int, set[int]], owned_by: dict[int, str],
                   optimizers: dict[int, torch.optim.Optimizer | None], freeing: BackwardRecord,
                   failing: BackwardRecord) -> None:
        """The one optimizer that owns everything both backwards reach, serves both, and did not step
        between them (what makes summing the losses or retain_graph=True safe)."""
        if cause.cuts or len(reached) < 2 or any(o is None for o in optimizers.values()):
            return
        both = reached[freeing.id] | reached[failing.id]
        owned = {owned_by[p] for p in both if p in owned_by}
        names = {self.names[id(o)] for o in optimizers.values() if o is not None}
        if len(owned) == 1 and owned == names and not owned & set(cause.stepped_between):
            cause.one_owner = owned.pop()
            cause.owned_reached = sum(p in owned_by for p in both)

    # ------------------------------------------------------------------ autograd.grad's result
    def _grad_result(self, freeing: BackwardRecord, failing: BackwardRecord) -> str | None:
        """The name the freeing ``autograd.grad`` call's result gets, when the failing backward's loss is made
        from it (in the source of the function running both, between their lines)."""
        first, last = self.trace.site(freeing.site), self.trace.site(failing.site)
        if freeing.api != "grad" or freeing.create_graph or first is None or last is None or self.frame is None:
            return None
        if not (_runs_in(first, self.frame) and _runs_in(last, self.frame)) or first.line >= last.line:
            return None
        tree = function_node(self.frame.f_code)
        statements = [] if tree is None else [s for s in ast.walk(tree) if isinstance(s, ast.stmt)]
        results = set().union(*(_stored(s) for s in statements if s.lineno == first.line and not hasattr(s, "body")))
        needed = set().union(*(_loaded(s) for s in statements if s.lineno == last.line and not hasattr(s, "body")))
        for statement in sorted(statements, key=lambda s: -s.lineno):  # from the backward up to the grad call
            if first.line < statement.lineno < last.line and _stored(statement) & needed:
                needed |= _loaded(statement)
        fed = sorted(results & needed)
        return fed[0] if fed else None


def _user_frames(start: FrameType | None) -> list[FrameType]:
    from ..lines.frames import user_frames

    return list(user_frames(start))[:8]


def _runs_in(site: CallSite, frame: FrameType) -> bool:
    """Whether ``site`` is a line of the function ``frame`` runs."""
    return site.function == frame.f_code.co_name and site.file == display_path(frame.f_code.co_filename)


def _line_in(trace: Any, site_id: int | None, where: tuple[str, str]) -> int | None:
    """The site id of the frame of ``site_id``'s chain that runs in the function ``where`` ((file,
    function)), or None."""
    while site_id is not None:
        site = trace.sites[site_id]
        if (site.file, site.function) == where:
            return site_id
        site_id = site.caller
    return None


def _single_chain(node: Any, flags_of: dict[Any, int], limit: int = 8) -> list[Any]:
    """``node`` and the nodes below it while each has one child that is no parameter and reaches only other
    optimizers' parameters (``img.view(...)`` inside a module, over the ``gen_imgs`` the loop passed it)."""
    chain = [node]
    while len(chain) < limit:
        kids = [c for c, _ in chain[-1].next_functions if c is not None and getattr(c, "variable", None) is None]
        if len(kids) != 1 or flags_of.get(kids[0]) != FOREIGN:
            break
        chain.append(kids[0])
    return chain


_VIEWS = ("View", "Transpose", "TBackward", "Permute", "Expand", "Squeeze", "Unsqueeze", "Select", "Slice", "Alias",
          "AsStrided", "Unbind", "Split", "Reshape")


def _views_a_parameter(node: Any) -> bool:
    """Whether ``node`` only views one parameter (``weight.t()`` inside ``F.linear``): no tensor of the user's."""
    while getattr(node, "variable", None) is None:
        kids = [child for child, _ in node.next_functions if child is not None]
        if len(kids) != 1 or not any(view in node.name() for view in _VIEWS):
            return False
        node = kids[0]
    return True


def _leaves(node: Any, limit: int = _LIMIT) -> set[int]:
    """``id()`` of the parameters below ``node``."""
    _, _, reached = graph_flags([node], set(), set(), limit)
    return reached


def _name_on_line(frame: FrameType, line: int, node: Any) -> str | None:
    """The name (or dotted attribute) used on ``line`` of ``frame``'s function whose value is a tensor made
    by ``node``."""
    tree = function_node(frame.f_code)
    if tree is None:
        return None
    for expression in ast.walk(tree):
        if isinstance(expression, (ast.Name, ast.Attribute)) and getattr(expression, "lineno", 0) == line \
                and isinstance(getattr(expression, "ctx", None), ast.Load):  # fmt: skip
            name = dotted_name(expression)
            value = resolve(frame, name) if name else None
            if isinstance(value, torch.Tensor) and value.grad_fn is node:
                return name
    return None


def _assigning_site(trace: Any, site_id: int | None, name: str, attr: str | None) -> tuple[str, int] | None:
    """(the name as the line spells it, the site) of the frame in ``site_id``'s chain whose line assigns the
    holder: ``name`` itself, or for an attribute any ``<object>.attr`` (``self.target`` in ``__init__``)."""
    while site_id is not None:
        site = trace.sites[site_id]
        try:
            statement = ast.parse(site.source).body[0] if site.source else None
        except SyntaxError:
            statement = None
        for target in _stored_expressions(statement):
            spelled = dotted_name(target)
            if spelled == name or (attr is not None and isinstance(target, ast.Attribute) and target.attr == attr):
                return spelled or name, site_id
        site_id = site.caller
    return None


def _stored_expressions(statement: ast.stmt | None) -> list[ast.expr]:
    if isinstance(statement, ast.Assign):
        targets = list(statement.targets)
    elif isinstance(statement, (ast.AnnAssign, ast.AugAssign)):
        targets = [statement.target]
    else:
        return []
    flat: list[ast.expr] = []
    while targets:
        target = targets.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            targets.extend(target.elts)
        else:
            flat.append(target.value if isinstance(target, ast.Starred) else target)
    return flat


def _stored(statement: ast.stmt) -> set[str]:
    return {n for n in map(dotted_name, _stored_expressions(statement)) if n}


def _loaded(statement: ast.stmt) -> set[str]:
    return {n.id for n in ast.walk(statement) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
