"""Errors raised on a step seen light, explained from the graph still alive and the frames that ran.

On a light step (:mod:`.detail`) no pack hook noted the lines of the ops.
When a backward fails there, what graphwatch says must be as good as on a
step seen in full detail, so it is found then, while the graph and the
user's frames are still there:

- :func:`lines_from_frames`: the nodes that the user's variables hold
  (``fake_loss``'s node, ``hidden``'s) take the line of the statement that
  binds the variable, in the function whose frame holds it;
- :func:`name_freeing_roots`: the backward that freed the graph, when it ran
  light, is given the records of the nodes it started from (while its tensors
  live on), so that "the same tensor backwarded twice" is told from "two
  losses sharing a graph";
- :func:`explain_inplace`: torch's own "modified by an inplace operation"
  error (on a light step torch checks versions itself) gets what graphwatch
  adds on a full step: where the tensor was saved, in which step, and why
  its version moved when an ``optimizer.step()`` moved it.

Example::

    >>> import sys, torch
    >>> from graphwatch.capture.recorder import Recorder
    >>> recorder = Recorder()
    >>> def train(x):
    ...     y = x.exp()
    ...     y.add_(1)  # the bug: exp saved y for its backward
    ...     try:
    ...         y.sum().backward()
    ...     except RuntimeError as error:
    ...         explain_inplace(recorder, error, [y.grad_fn], sys._getframe())
    ...         return str(error).split("graphwatch: ")[1]
    >>> print(train(torch.ones(3, requires_grad=True)))  # doctest: +ELLIPSIS
    the tensor was saved at <doctest ...>:2 (step 0). Something changed it in place after autograd saved it; ...
"""

from __future__ import annotations

from types import FrameType, SimpleNamespace
from typing import Any

import torch

from ...model import NodeRecord
from ..graph.graph_walk import METADATA_KEY, root_records
from ..graph.node_types import node_type
from ..hooks.inplace_hints import inplace_addition
from ..hooks.saved_views import SavedTensor, raw_data
from ..lines.frames import user_frames
from ..lines.source import assignments, function_node
from .holders import assignment_line, tensors_in_frame

_INPLACE_MARKER = "modified by an inplace operation"
_FRAMES = 8  # innermost user frames looked at
_SEARCH_LIMIT = 100_000  # nodes looked at for the one whose saved tensor was modified


def lines_from_frames(recorder: Any, start: FrameType | None) -> None:
    """Records with no line (built after the fact) of the nodes the user's variables hold: the line of the
    statement binding the variable (``total += loss``, ``fake_loss = ...``) in the frame's function."""
    for frame in list(user_frames(start))[:_FRAMES]:
        for name, tensor in tensors_in_frame(frame):
            node: Any = tensor.grad_fn  # (tensors_in_frame yields tensors with a grad_fn)
            tag = node.metadata.get(METADATA_KEY)
            record = tag.record if tag is not None and tag.recorder is recorder else None
            if record is not None and record.site is None:
                line = assignment_line(frame.f_code, name)
                if line is not None:
                    record.site = recorder.sites.from_frame(frame, line)


def name_freeing_roots(recorder: Any, freed: list[NodeRecord]) -> None:
    """Give the backward that freed the first of ``freed`` (when it ran light) the records of its roots."""
    if not freed or freed[0].freed_by is None:
        return
    backward = recorder.trace.backwards[freed[0].freed_by]
    if not backward.roots:
        roots = recorder.light_backwards.roots_alive(backward.id)
        if roots:
            backward.roots = root_records(recorder, roots)


def explain_inplace(recorder: Any, error: RuntimeError, roots: list[Any], start: FrameType | None) -> None:
    """Add to torch's "modified by an inplace operation" ``error`` (raised on a light step, where torch did the
    check) what graphwatch says on a full step, in place: the line that saved the tensor, its step, and the line
    that changed it or why its version moved (as :func:`~graphwatch.capture.hooks.saved.inplace_message` does)."""
    text = str(error)
    if _INPLACE_MARKER not in text or "\n\ngraphwatch: " in text:
        return
    found = _modified_saved(roots, text)
    if found is None:
        return
    node, tensor, output = found
    step = recorder.clock.step_of(node._sequence_nr())
    try:
        storage: tuple | None = (tensor.untyped_storage().data_ptr(), tensor.is_cuda)
    except (RuntimeError, NotImplementedError, TypeError):
        storage = None
    handle = SimpleNamespace(  # what the pack hook would have noted (read now, from the node and the frames)
        site=_line_of(recorder, node, tensor, start), step=step, storage=storage, alias=tensor,
        leaf=output is None and tensor.is_leaf,  # (a saved output is stored without its grad_fn: no leaf)
        kind="parameter" if tensor.is_leaf and tensor.requires_grad else "activation", is_input=output is None,
        output_of=(node.name(), output) if output is not None else None, version=tensor._version,
    )
    error.args = (text + inplace_addition(recorder, handle, tensor), *error.args[1:])


def _modified_saved(roots: list[Any], text: str) -> tuple[Any, torch.Tensor, int | None] | None:
    """(the node, the saved tensor, its output number when the node saved its own output) whose unpack raises
    the very error ``text`` begins with."""
    first = text.split("\n")[0]
    stack, seen = [root for root in roots if root is not None], set[int]()
    while stack and len(seen) < _SEARCH_LIMIT:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for attr in node_type(node).saved_attrs:
            try:
                getattr(node, "_saved_" + attr[len("_raw_saved_"):])
            except RuntimeError as error:
                if str(error).split("\n")[0] == first:
                    raw = getattr(node, attr)
                    data = raw_data(raw) if type(raw) is SavedTensor else None
                    if isinstance(data, torch.Tensor):
                        name = attr[len("_raw_saved_"):]
                        output = int(name[len("result"):] or 0) if name.startswith("result") else None
                        return node, data, output
            except Exception:  # not a tensor slot torch can read back
                continue
        stack.extend(child for child, _ in node.next_functions if child is not None)
    return None


def _line_of(recorder: Any, node: Any, tensor: torch.Tensor, start: FrameType | None) -> int | None:
    """The line that saved ``tensor`` in ``node``: noted by a pack hook (a full step), or by one in a full step
    that ran the same code (:mod:`.line_templates`), or the statement that binds a variable holding the node's
    output, or else the tensor itself (its op saved it)."""
    seq = node._sequence_nr()
    step = recorder.clock.step_of(seq)
    site = recorder.clock.site_of(seq) if recorder.is_full_step(step) else recorder.template_site(node, seq, node.name(), step)[0]
    if site is not None:
        return site
    holding = None
    for frame in list(user_frames(start))[:_FRAMES]:
        for name, value in tensors_in_frame(frame):
            if value.grad_fn is node:
                return _bound_at(recorder, frame, name)
            if holding is None and _same_tensor(value, tensor):
                holding = (frame, name)
    return _bound_at(recorder, *holding, made=True) if holding is not None else None


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``b`` (read from a saved slot) is ``a`` or an alias of it saved as an output."""
    if a is b:
        return True
    try:
        return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a._version == b._version
    except RuntimeError:
        return False


def _bound_at(recorder: Any, frame: FrameType, name: str, made: bool = False) -> int | None:
    """The site of the line of ``frame``'s function that binds ``name`` (``made``: that makes its value, not
    one that changes it in place or adds to it)."""
    node = function_node(frame.f_code) if made else None
    plain = [line for line, grows in assignments(node, name.split("[")[0]) if not grows] if node is not None else []
    line = max(plain) if plain else assignment_line(frame.f_code, name)
    return recorder.sites.from_frame(frame, line) if line is not None else None
