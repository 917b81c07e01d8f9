"""What the user's frames say about three of torch's autograd errors, read once torch has raised.

Nothing here runs on a step where nothing goes wrong: each finder is called with the error in hand, from the
frames still on the stack (``torch.autograd.grad``'s unused input, raised by the engine graphwatch wraps) or
kept by the traceback of an error that leaves the session (a non-scalar backward, raised before the engine
runs; a leaf changed in place, raised by the user's own op).

- :func:`find_non_scalar`: the tensor backwarded, its shape, the line that made it, and the criterion built
  with ``reduction='none'`` that made it (named where it is built);
- :func:`find_unused_input`: the input the outputs' graph does not reach, where it was made, and the tensors
  of the same shape the outputs were computed from instead (reached by their graph, or saved by its ops);
- :func:`find_leaf_inplace`: the statement that changed a leaf in place, the tensor it names, and the
  module parameter it is.

Example::

    >>> import ast
    >>> from graphwatch.capture.causes.error_frames import innermost_statement
    >>> tree = ast.parse("for p in params:\\n    p -= lr * (\\n        p.grad)\\n")
    >>> type(innermost_statement(tree, 3)).__name__, innermost_statement(tree, 3).lineno
    ('AugAssign', 2)
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

import torch

from ...model.error_causes import LeafInplaceCause, NonScalarCause, SeenTensor, UnusedInputCause
from ..graph.node_types import node_type, saved_data
from ..hooks.saved import SavedHandle
from ..lines.callsite import is_user_file
from ..lines.frames import named_values, resolve, user_frames
from ..lines.source import assignments, dotted_name, function_node, inplace_statement, module_node
from .holders import _attribute_site, parameter_names

if TYPE_CHECKING:
    from ..recorder import Recorder

_FRAMES = 8  # user frames looked at, innermost first
_NODES = 100_000  # nodes of the outputs' graph walked at an unused-input error
_LOSS_DEPTH = 8  # nodes below a non-scalar loss looked at for one that ran with reduction='none'


def traceback_frames(tb: TracebackType | None) -> list[tuple[FrameType, int]]:
    """(frame, line) of each entry of a traceback, innermost first."""
    entries = []
    while tb is not None:
        entries.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    return entries[::-1]


def _user_entries(tb: TracebackType | None) -> list[tuple[FrameType, int]]:
    return [(f, n) for f, n in traceback_frames(tb) if is_user_file(f.f_code.co_filename)][:_FRAMES]


def _frames_from(frame: FrameType) -> list[FrameType]:
    return list(user_frames(frame))[:_FRAMES]


def names_of(frames: Iterable[FrameType], tensor: torch.Tensor) -> tuple[str, FrameType] | None:
    """The first name (innermost frame first, locals before globals) that holds ``tensor`` itself."""
    for frame in frames:
        for name, value in named_values(frame):
            if value is tensor and not name.startswith("_"):
                return name, frame
    return None


def innermost_statement(tree: ast.AST | None, line: int) -> ast.stmt | None:
    """The simple (not compound) statement of ``tree`` whose lines hold ``line``."""
    found = [
        node for node in ast.walk(tree) if isinstance(node, ast.stmt) and not hasattr(node, "body")
        and node.lineno <= line <= (node.end_lineno or node.lineno)
    ] if tree is not None else []  # fmt: skip
    return max(found, key=lambda node: node.lineno, default=None)


def assigned_at(recorder: Recorder, frame: FrameType, name: str) -> int | None:
    """The site of the line that assigns the dotted ``name`` as ``frame`` spells it: in its function (the last
    assignment before the line it runs, else the first), else in its module; ``obj.attr`` in ``obj``'s class."""
    if "." in name:
        return _attribute_site(recorder, frame, name)
    code = frame.f_code
    for tree, in_function in ((function_node(code), True), (module_node(code.co_filename), False)):
        lines = sorted(n for n, grows in assignments(tree, name) if not grows) if tree is not None else []
        if not lines:
            continue
        before = [n for n in lines if n <= frame.f_lineno] if in_function else []
        line = before[-1] if before else lines[0]
        return recorder.sites.from_code(code, line) if in_function else recorder.sites.from_file(code.co_filename, line)
    return None


def node_site(recorder: Recorder, node: Any) -> int | None:
    """The line that made ``node``, where graphwatch saw it: a tensor it saved, or its own pack or call."""
    if node is None:
        return None
    for data in saved_data(node, node_type(node)):
        if type(data) is SavedHandle and data.site is not None:
            return data.site
    seq = node._sequence_nr()
    return recorder.clock.site_of(seq) if recorder.precise or recorder.clock.packed(seq) else None


def _made_at(recorder: Recorder, tensor: torch.Tensor, named: tuple[str, FrameType] | None) -> int | None:
    site = node_site(recorder, tensor.grad_fn)
    return site if site is not None or named is None else assigned_at(recorder, named[1], named[0])


# ------------------------------------------------------------------ non-scalar backward
def _backwarded(tb: TracebackType | None) -> torch.Tensor | None:
    """The tensor torch found not scalar: ``out`` of ``torch.autograd``'s ``_make_grads`` (else ``self`` of
    ``Tensor.backward``), from the traceback's frames."""
    for frame, _ in traceback_frames(tb):
        for name in ("out", "self"):
            value = frame.f_locals.get(name) if frame.f_code.co_name in ("_make_grads", "backward") else None
            if isinstance(value, torch.Tensor):
                return value
    return None


def _unreduced_op(loss: torch.Tensor) -> str | None:
    """The first node near the top of the loss's graph that ran with ``reduction='none'`` (torch's 0)."""
    queue, seen = [loss.grad_fn], 0
    while queue and seen < _LOSS_DEPTH:
        node = queue.pop(0)
        if node is None:
            continue
        seen += 1
        if getattr(node, "_saved_reduction", None) == 0:
            return node.name()
        queue.extend(child for child, _ in node.next_functions)
    return None


def _criteria(frames: list[FrameType]) -> Iterator[tuple[str, torch.nn.Module, FrameType]]:
    """(name, module, frame) of each module with ``reduction == 'none'`` the frames hold (also inside a module:
    ``self.criterion``), each once."""
    seen: set[int] = set()
    for frame in frames:
        for var, value in named_values(frame):
            if not isinstance(value, torch.nn.Module) or var.startswith("_"):
                continue
            for name, module in value.named_modules(prefix=var):
                if getattr(module, "reduction", None) == "none" and id(module) not in seen:
                    seen.add(id(module))
                    yield name, module, frame


def find_non_scalar(recorder: Recorder, tb: TracebackType | None) -> NonScalarCause:
    """What made the tensor a backward without a gradient was called on, from the error's traceback."""
    entries = _user_entries(tb)
    if not entries:
        return NonScalarCause(None)
    frame, line = entries[0]
    cause = NonScalarCause(recorder.sites.from_frame(frame, line))
    loss = _backwarded(tb)
    if loss is None:
        return cause
    frames = [f for f, _ in entries]
    named = names_of(frames, loss)
    cause.name, cause.shape = named[0] if named else None, tuple(loss.shape)
    cause.made_at = _made_at(recorder, loss, named)
    cause.unreduced_op = _unreduced_op(loss)
    made = recorder.trace.site(cause.made_at)
    source = made.source if made is not None else ""
    criteria = list(_criteria(frames))
    called = [c for c in criteria if f"{c[0]}(" in source]
    chosen = called[0] if called else criteria[0] if len(criteria) == 1 and cause.unreduced_op else None
    if chosen is not None:
        name, module, where = chosen
        cause.criterion, cause.criterion_type, cause.criterion_only = name, type(module).__name__, not called
        cause.built_at = assigned_at(recorder, where, name)
    return cause


# ------------------------------------------------------------------ unused input of autograd.grad
def engine_inputs(args: tuple, kwargs: dict) -> tuple[Any, ...]:
    """The ``inputs`` of one engine call (``_engine_run_backward(outputs, grads, retain, create, inputs, ...)``)."""
    inputs = args[3] if len(args) > 3 else kwargs.get("inputs", ())
    return tuple(inputs or ())


def _graph_reach(outputs: Iterable[Any]) -> tuple[list[Any], set[int], list[tuple[torch.Tensor, int | None]]]:
    """(the nodes the outputs' graph reaches, held so that their ids stay theirs; the ids of the leaves it
    accumulates into; the tensors its ops saved, with the line that saved each)."""
    roots = [o.grad_fn if isinstance(o, torch.Tensor) else getattr(o, "node", None) for o in outputs]
    nodes: list[Any] = []
    seen: set[int] = set()
    leaves: set[int] = set()
    saved: list[tuple[torch.Tensor, int | None]] = []
    stack = [r for r in roots if r is not None]
    while stack and len(nodes) < _NODES:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        nodes.append(node)
        variable = getattr(node, "variable", None)
        if isinstance(variable, torch.Tensor):
            leaves.add(id(variable))
        for data in saved_data(node, node_type(node)):
            if type(data) is SavedHandle and isinstance(data.alias, torch.Tensor):
                saved.append((data.alias, data.site))
            elif isinstance(data, torch.Tensor):
                saved.append((data, None))
        stack.extend(child for child, _ in node.next_functions if child is not None)
    return nodes, leaves, saved


def _same_data(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a is b or (a.shape == b.shape and a.device == b.device and a.numel() > 0 and a.data_ptr() == b.data_ptr())


def _reached(tensor: torch.Tensor, node_ids: set[int], leaves: set[int]) -> bool:
    return id(tensor.grad_fn) in node_ids if tensor.grad_fn is not None else id(tensor) in leaves


def find_unused_input(
    recorder: Recorder, start: FrameType | None, call_at: int | None, outputs: Iterable[Any], inputs: tuple[Any, ...],
    index: int | None,
) -> UnusedInputCause:
    """Which input of a ``torch.autograd.grad`` the outputs do not reach (``index``, as torch's message gives
    it, else the first one their graph does not reach), and what they were computed from instead."""
    nodes, leaves, saved = _graph_reach(outputs)
    node_ids = {id(node) for node in nodes}
    tensors = [t if isinstance(t, torch.Tensor) else None for t in inputs]
    if index is None:
        index = next((i for i, t in enumerate(tensors) if t is not None and not _reached(t, node_ids, leaves)), 0)
    cause = UnusedInputCause(call_at, index, count=len(inputs))
    unused = tensors[index] if index < len(tensors) else None
    if unused is None:
        return cause
    frames = _frames_from(start) if start is not None else []
    named = names_of(frames, unused)
    cause.name, cause.shape = named[0] if named else None, tuple(unused.shape)
    cause.made_at = _made_at(recorder, unused, named)
    taken: set[int] = {id(unused)}
    for frame in frames:
        for name, value in named_values(frame):
            if not isinstance(value, torch.Tensor) or id(value) in taken or name.startswith("_"):
                continue
            if value.shape != unused.shape:
                continue
            used_at = next((site for t, site in saved if _same_data(t, value)), None)
            if not _reached(value, node_ids, leaves) and not any(_same_data(t, value) for t, _ in saved):
                continue
            taken.add(id(value))
            made_at = _made_at(recorder, value, (name, frame))
            cause.seen.append(SeenTensor(name, made_at, used_at, value.requires_grad))
    return cause


# ------------------------------------------------------------------ leaf changed in place
def _leaf(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_leaf and value.requires_grad


def find_leaf_inplace(recorder: Recorder, tb: TracebackType | None) -> LeafInplaceCause:
    """The statement that changed a leaf in place, the tensor it names, and the module parameter it is."""
    entries = _user_entries(tb)
    if not entries:
        return LeafInplaceCause(None)
    frame, line = entries[0]
    statement = innermost_statement(function_node(frame.f_code), line)
    first = statement.lineno if statement is not None else line
    cause = LeafInplaceCause(recorder.sites.from_frame(frame, first))
    if statement is None:
        return cause
    spelled = inplace_statement(statement)
    names = [spelled] if spelled else []
    names += [n for n in map(dotted_name, ast.walk(statement)) if n and n not in names]  # type: ignore[arg-type]
    target = next(((n, v) for n in names if _leaf(v := resolve(frame, n))), None)
    if target is None:
        return cause
    cause.target, tensor = target
    cause.shape = tuple(tensor.shape)
    cause.parameter = next((name for name, p in parameter_names(frame).items() if p is tensor), None)
    cause.is_parameter = cause.parameter is not None or isinstance(tensor, torch.nn.Parameter)
    return cause
