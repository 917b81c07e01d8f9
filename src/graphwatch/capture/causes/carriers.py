"""Name the tensor that carries a graph from one step into the next, as the training loop spells it.

When a backward runs into a node of an earlier step, that node's output was
kept by some Python value and fed into this step's forward.  The node's own
line (``output, hidden = self.rnn(emb, hidden)`` inside ``forward``) is
often not where the user can fix it: the fix belongs in the loop.  So, while
the backward's frames are still on the stack, graphwatch looks at the values
the loop's frames can reach by name (locals, globals, one level into lists,
tuples and dicts, and the tensor attributes of ``nn.Module``s there) for:

- the very node (a tensor kept and reused: ``self.target``, a cache), or
- a node of the same op made in this step, held by a variable that the loop
  reads before it assigns it (``hidden`` in ``output, hidden = model(x, hidden)``:
  this step's value of the variable that carried the last step's).

The name comes with the line of the loop's function that assigns it and the
statement that cuts the graph there (``hidden = repackage_hidden(hidden)``
when the script has such a helper and the value is a tuple).

Example::

    >>> import torch
    >>> from graphwatch.capture.causes.carriers import detach_statement
    >>> detach_statement("hidden", torch.zeros(1), {}), detach_statement("hidden", (torch.zeros(1),), {})
    ('hidden = hidden.detach()', 'hidden = tuple(h.detach() for h in hidden)')
"""

from __future__ import annotations

import ast
import inspect
import re
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

import torch

from ..graph.graph_walk import METADATA_KEY
from ..lines.frames import local_value, named_values, user_frames
from ..lines.source import assignments, function_node
from .attribute_stores import store_site
from .held_values import _of_a_user_class, attribute_items, first_items, key_text, sequence_items
from .holders import parameter_update_site
from .stores import a_buffer, renewing_site
from .values import runtime_type, set_to_none

if TYPE_CHECKING:
    from ...model import NodeRecord
    from ..recorder import Recorder

_HELPER = re.compile(r"repackage|detach", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class CarrierName:
    """The carried value as the loop names it: ``name``, the line assigning it, and the fix there."""

    name: str
    line: int | None
    frame_site: int | None  # CallSite id of that line (with the loop frame's caller)
    statement: str
    kind: str  # "recurrent" (this step's value of the variable that carried it) or "cached" (the same value)
    value_type: str = "other"  # the value's type as it ran (graphwatch.model.VALUE_TYPES)
    together: tuple[str, ...] = ()  # the names the line assigns with it that the loop carries too, with it


def name_carrier(recorder: Recorder, start: FrameType | None, carrier: NodeRecord) -> CarrierName | None:
    """How the user's frames from ``start`` outwards name the value that carried ``carrier`` (None: unknown)."""
    found = find_carrier(recorder, start, carrier)
    return None if found is None else found[0]


def find_carrier(
    recorder: Recorder, start: FrameType | None, carrier: NodeRecord
) -> tuple[CarrierName, torch.Tensor] | None:
    """:func:`name_carrier`, with the tensor found; failing that, an attribute (of a module, or of an object
    of the user's own class) whose value this step made from ``carrier``: ``self.hidden`` of a Lightning
    module, ``self.baseline`` of a ``Trainer`` subclass, seen from the framework's frames."""
    frames = list(user_frames(start))[:8]
    found = _found_in_loops(recorder, frames, carrier)
    if found is not None:
        return found
    for frame in frames:
        for name, value, tensor in _named_tensors(frame, attributes=True):
            if "." in name and _made_from(tensor, carrier, recorder.step):
                statement = detach_statement(name, value, frame.f_globals)
                site = renewing_site(recorder, frame, name, value)
                kind = "buffer" if a_buffer(frame, tensor) else "recurrent"
                return CarrierName(name, None, site, statement, kind, _value_type(frame, name, value)), tensor
    return _parameters_carrying(recorder, frames, carrier)


def _parameters_carrying(
    recorder: Recorder, frames: list[FrameType], carrier: NodeRecord
) -> tuple[CarrierName, torch.Tensor] | None:
    """A module (as a frame names it) whose parameters this step's graph made from ``carrier``: updated in place
    outside ``no_grad`` (an EMA teacher), each update adds to a graph the next forward runs into.  Named
    ``teacher.parameters()``, with the line of the update, which the source must show: a ``Parameter`` gets a
    graph only from an in-place op, but a module may hold other tensors as parameters (a meta-learning
    library's fast weights, made out of place)."""
    for frame in frames:
        for name, value in named_values(frame):
            if not issubclass(type(value), torch.nn.Module):
                continue
            for parameter in value.parameters():
                if not issubclass(type(parameter), torch.nn.Parameter) or parameter.grad_fn is None:
                    continue
                if _made_from(parameter, carrier, recorder.step):
                    holder = f"{name}.parameters()"
                    update = parameter_update_site(recorder, holder, frame)
                    return (CarrierName(holder, None, update, "", "parameters"), parameter) if update is not None else None
    return None


def _found_in_loops(
    recorder: Recorder, frames: list[FrameType], carrier: NodeRecord
) -> tuple[CarrierName, torch.Tensor] | None:
    """The value a frame's loop feeds from step to step, or the very node kept (see the module's doc)."""
    for frame in frames:
        carried = _loop_carried(frame)
        for name, value, tensor in _named_tensors(frame):
            node: Any = tensor.grad_fn  # _named_tensors yields only tensors with a grad_fn
            tag = node.metadata.get(METADATA_KEY)
            same = tag is not None and tag.recorder is recorder and tag.record is not None and tag.record.id == carrier.id
            renewed = (
                name.split(".")[0] in carried
                and node.name() == carrier.op
                and recorder.clock.step_of(node._sequence_nr()) == recorder.step
            )
            if same or renewed:
                line = _assignment_line(frame, name)
                site = recorder.sites.from_frame(frame, line) if line is not None else None
                if site is None and same:  # an attribute kept as stored: its class's line that stored it
                    site = store_site(recorder.sites, frame, name)
                kind = "recurrent" if not same else ("cached" if _reaches_trained(tensor, recorder) else "constant")
                together = _carried_together(frame, name, line, carried) if kind == "recurrent" else [name]
                statement = detach_statement(name, value, frame.f_globals)
                if len(together) > 1 and statement == f"{name} = {name}.detach()":  # an LSTM's (h, c)
                    statement = f"{', '.join(together)} = {', '.join(f'{n}.detach()' for n in together)}"
                with_it = tuple(together) if len(together) > 1 else ()
                return CarrierName(name, line, site, statement, kind, _value_type(frame, name, value), with_it), tensor
    return None


def _value_type(frame: FrameType, name: str, value: Any) -> str:
    """The carried value's type as it ran, ``Optional[...]`` when the code that holds it sets it to None."""
    found = runtime_type(value)
    return f"Optional[{found}]" if found != "other" and set_to_none(frame, name) else found


def _made_from(tensor: torch.Tensor, carrier: NodeRecord, step: int, limit: int = 10_000) -> bool:
    """Whether ``tensor``'s graph of ``step`` runs into ``carrier`` (a node of an earlier step)."""

    def record(node: Any) -> NodeRecord | None:
        tag = node.metadata.get(METADATA_KEY)
        return None if tag is None else tag.record

    def of_this_step(node: Any) -> bool:  # below an earlier step's node lies no node of this step
        found = record(node)
        return found is None or found.step == step

    nodes = _nodes_below(tensor.grad_fn, limit, descend=of_this_step)
    return any((found := record(node)) is not None and found.id == carrier.id for node in nodes)


def _reaches_trained(tensor: torch.Tensor, recorder: Recorder) -> bool:
    """Whether the tensor's graph reaches a parameter an optimizer updates (any leaf that requires grad,
    before any optimizer has stepped)."""
    return reaches(tensor, recorder.optimizer_steps.parameters())


def reaches(tensor: torch.Tensor, parameters: set[int], limit: int = 10_000) -> bool:
    """Whether the tensor's graph reaches a leaf whose ``id()`` is in ``parameters`` (empty: any leaf that
    requires grad)."""
    for node in _nodes_below(tensor.grad_fn, limit):
        variable = getattr(node, "variable", None)
        if variable is not None and (id(variable) in parameters if parameters else variable.requires_grad):
            return True
    return False


def _nodes_below(root: Any, limit: int, descend: Callable[[Any], bool] | None = None) -> Iterator[Any]:
    """The nodes of ``root``'s graph, depth first, each once and at most ``limit`` of them; below a node only
    where ``descend(node)`` says so (everywhere without it)."""
    stack: list[Any] = [root]
    seen: set[Any] = set()
    while stack and len(seen) < limit:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        yield node
        if descend is None or descend(node):
            stack.extend(child for child, _ in node.next_functions)


def frontier(roots: list[Any], step: int) -> list[tuple[int, int]]:
    """The first edge, breadth first from ``roots``, from a node of ``step`` into a node of an earlier step.

    That is where a carried value enters this step's graph when what it was made of was not backwarded
    itself (an LSTM's ``(h, c)``, stacked from the nodes its loss ran through).  Record ids, or [].
    """
    queue = [(root, None) for root in roots if root is not None]
    seen: set[int] = set()
    while queue:
        next_queue: list[tuple[Any, Any]] = []
        for node, parent in queue:
            tag = node.metadata.get(METADATA_KEY)
            record = None if tag is None else tag.record
            if record is None or record.id in seen:
                continue
            seen.add(record.id)
            if record.step < step and parent is not None:
                return [(parent.id, record.id)]
            if record.step == step:
                next_queue.extend((child, record) for child, _ in node.next_functions if child is not None)
        queue = next_queue
    return []


def detach_statement(name: str, value: Any, namespace: dict) -> str:
    """The statement that keeps ``name``'s value and cuts its graph."""
    if issubclass(type(value), torch.Tensor):
        return f"{name} = {name}.detach()"
    helper = next((n for n, v in namespace.items() if _HELPER.search(n) and inspect.isfunction(v)), None)
    if helper is not None:
        return f"{name} = {helper}({name})"
    return f"{name} = tuple(h.detach() for h in {name})"


def _named_tensors(frame: FrameType, attributes: bool = False) -> Iterator[tuple[str, Any, torch.Tensor]]:
    """(name, the value bound to it, a tensor with a grad_fn in that value) for the frame's names; with
    ``attributes``, also the tensors in a module's tuple attributes (an LSTM's ``self.hidden``) and buffers, and
    in the attributes of objects of the user's own classes."""
    for name, value in named_values(frame):
        yield from _tensors_of(name, value, value, attributes=attributes)


def _tensors_of(
    name: str, top: Any, value: Any, depth: int = 0, attributes: bool = False
) -> Iterator[tuple[str, Any, torch.Tensor]]:
    if issubclass(type(value), torch.Tensor):
        if value.grad_fn is not None:
            yield name, top, value
    elif issubclass(type(value), torch.nn.Module):
        for module in list(value.modules()):
            prefix = f"{name}." if module is value else "self."
            for attr, item in list(vars(module).items()):
                yield from _attribute_tensors(prefix + attr, item, attributes)
            for attr, buffer in list(module._buffers.items()) if attributes else ():  # a running statistic
                if buffer is not None and buffer.grad_fn is not None:  # renewed outside no_grad
                    yield prefix + attr, buffer, buffer
    elif depth < 2 and issubclass(type(value), (list, tuple)):  # a list of per-layer (h, c) states too
        for item in sequence_items(value, last=True)[1]:
            yield from _tensors_of(name, top, item, depth + 1)
    elif depth == 0 and issubclass(type(value), dict):
        for _, item in first_items(value):
            yield from _tensors_of(name, top, item, 1)
    elif depth == 0 and attributes and _of_a_user_class(value):
        for attr, item in attribute_items(value):
            yield from _attribute_tensors(f"{name}.{attr}", item, attributes)


def _attribute_tensors(label: str, item: Any, tuples: bool) -> Iterator[tuple[str, Any, torch.Tensor]]:
    """An attribute's tensor with a graph, and with ``tuples`` those of a tuple it holds."""
    if issubclass(type(item), torch.Tensor) and item.grad_fn is not None:
        yield label, item, item
    elif tuples and issubclass(type(item), tuple):
        yield from ((label, item, t) for t in item if issubclass(type(t), torch.Tensor) and t.grad_fn is not None)


def _loop_carried(frame: FrameType) -> set[str]:
    """Names the frame's function reads in a loop around its current line before (or while) it assigns them
    there (a loop over a model's layers, beside it, carries its own names from layer to layer, not from step
    to step)."""
    node = function_node(frame.f_code)
    if node is None:
        return set()
    carried: set[str] = set()
    here = frame.f_lineno
    loops = (n for n in ast.walk(node) if isinstance(n, (ast.For, ast.While)) and n.lineno <= here <= (n.end_lineno or 0))
    for loop in loops:
        target = loop.target if isinstance(loop, ast.For) else None  # the loop rebinds it every iteration
        carried |= _read_first(loop.body, _stored(target) if target is not None else set())
    return carried


def _read_first(body: list[ast.stmt], assigned: set[str]) -> set[str]:
    """The names the statements of ``body``, in order, read before they assign them (``assigned``: the names
    bound already, added to as they are).  A nested ``for`` binds its target before its body reads it (an EMA
    update's ``for tp, sp in zip(...)`` carries no ``tp``)."""
    carried: set[str] = set()
    for statement in _statements(body):
        if isinstance(statement, ast.For):
            carried |= _loaded(statement.iter) - assigned
            assigned |= _stored(statement.target)
            carried |= _read_first(statement.body + statement.orelse, assigned)
            continue
        reads = _loaded(statement)
        if isinstance(statement, ast.AugAssign) and isinstance(statement.target, ast.Name):
            reads.add(statement.target.id)
        carried |= reads - assigned
        assigned |= _stored(statement)
    return carried


def _loaded(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _stored(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _carried_together(frame: FrameType, name: str, line: int | None, carried: set[str]) -> list[str]:
    """The names the carrier's line assigns with it that the loop carries too and that hold a tensor with
    a graph (``h, c = cell(x, (h, c))``: both), in the line's order; just ``[name]`` otherwise."""
    node = function_node(frame.f_code)
    if node is None or line is None:
        return [name]
    for statement in ast.walk(node):
        if isinstance(statement, ast.Assign) and statement.lineno == line and len(statement.targets) == 1:
            target = statement.targets[0]
            if isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts):
                names = [e.id for e in target.elts if isinstance(e, ast.Name)]
                if name in names:
                    return [n for n in names if n == name or (n in carried and _holds_graph(local_value(frame, n)))]
    return [name]


def _holds_graph(value: Any) -> bool:
    return issubclass(type(value), torch.Tensor) and value.grad_fn is not None


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The simple statements of a block in source order, into ``if``/``with``/``try`` blocks."""
    for statement in body:
        if isinstance(statement, (ast.If, ast.With, ast.Try)):
            yield from _statements(statement.body)
            for handler in getattr(statement, "handlers", []):
                yield from _statements(handler.body)
            yield from _statements(getattr(statement, "orelse", []))
            yield from _statements(getattr(statement, "finalbody", []))
        elif not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield statement


def _assignment_line(frame: FrameType, name: str) -> int | None:
    """The line of the frame's function that assigns ``name``: inside a loop around the frame's line if one
    does (the value carried from iteration to iteration), else the last one before that line."""
    node = function_node(frame.f_code)
    if node is None or name.startswith("self."):
        return None
    lines = [line for line, _ in assignments(node, name.split("[")[0])]
    here = frame.f_lineno
    loops = [
        n for n in ast.walk(node) if isinstance(n, (ast.For, ast.While)) and n.lineno <= here <= (n.end_lineno or 0)
    ]
    in_loop = [n for n in lines if any(loop.lineno <= n <= (loop.end_lineno or 0) for loop in loops)]
    before = [n for n in lines if n <= here]
    return max(in_loop) if in_loop else (max(before) if before else None)


def holders_of(start: FrameType | None, node: Any, limit: int = 8, budget: int = 20_000) -> list[tuple[str, str | None]]:
    """(name, attribute) of each value the innermost ``limit`` user frames reach that is a tensor whose
    ``grad_fn`` is ``node``: variables, items of lists, tuples and dicts, and attributes of modules (of all
    their submodules) and of objects of the user's own classes, a few levels deep (``model.style_3.target``,
    ``self.policy.baseline``); ``attribute`` is the last attribute's name (None for a plain variable).
    Looked at once per error, at most ``budget`` values."""
    found: dict[str, str | None] = {}
    seen: set[int] = set()
    queue: deque[tuple[str, Any, int, str | None]] = deque()
    for frame in list(user_frames(start))[:limit]:
        names = (*frame.f_code.co_varnames, *frame.f_code.co_cellvars, *frame.f_code.co_freevars)
        queue.extend((name, local_value(frame, name), 0, None) for name in dict.fromkeys(names))
        queue.extend((name, value, 0, None) for name, value in list(frame.f_globals.items()) if not name.startswith("__"))
    while queue and budget > 0:
        label, value, depth, attr = queue.popleft()
        budget -= 1
        if value is None or id(value) in seen:
            continue
        seen.add(id(value))
        if issubclass(type(value), torch.Tensor):
            if value.grad_fn is node:
                found.setdefault(label, attr)
        elif depth < 3:
            queue.extend((f"{label}{sub}", item, depth + 1, key) for sub, item, key in _members(value))
    return list(found.items())


def _members(value: Any) -> Iterator[tuple[str, Any, str | None]]:
    """(how to spell the member after its owner's name, the member, its attribute name) of a container, a
    module or an object of the user's own class."""
    if issubclass(type(value), (list, tuple)):
        yield from ((f"[{i}]", item, None) for i, item in enumerate(sequence_items(value)[1]))
    elif issubclass(type(value), dict):
        yield from ((f"[{key_text(k)}]", item, None) for k, item in first_items(value))
    elif issubclass(type(value), torch.nn.Module):
        for prefix, module in list(value.named_modules()):
            for attr, item in list(vars(module).items()):
                if not attr.startswith("_") and not issubclass(type(item), torch.nn.Module):
                    yield (f".{prefix}.{attr}" if prefix else f".{attr}"), item, attr
            for attr, item in list(module._buffers.items()):
                yield (f".{prefix}.{attr}" if prefix else f".{attr}"), item, attr
    elif _of_a_user_class(value) and not issubclass(type(value), type):  # (_of_a_user_class: it has a __dict__)
        for attr, item in attribute_items(value):
            if not attr.startswith("__"):
                yield f".{attr}", item, attr
