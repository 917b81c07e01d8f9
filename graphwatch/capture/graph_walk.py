"""Walk an autograd graph without recursion, tagging each node with its record.

A node is tagged once, the first time a walk reaches it: a :class:`NodeTag`
stored in ``node.metadata`` (which lives exactly as long as the node) holds
its :class:`~graphwatch.model.NodeRecord`, and its finalizer reports when the
node dies.  The walk links each node to the saved tensors its pack hooks
recorded (``node._raw_saved_<name>.data`` is the handle the pack hook
returned), so a node gets the step and line that created it.  Nothing here
holds a node after the walk returns.

Example::

    >>> import torch
    >>> from graphwatch.capture.recorder import Recorder
    >>> from graphwatch.capture.graph_walk import walk, node_record
    >>> recorder = Recorder()
    >>> y = (torch.ones(2, requires_grad=True) * 2).sum()
    >>> walk(recorder, [y.grad_fn]).nodes_reached
    2
    >>> node_record(y.grad_fn).op
    'SumBackward0'
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..model import NodeRecord
from .saved import SavedHandle

if TYPE_CHECKING:
    from .recorder import Recorder

METADATA_KEY = "graphwatch"
ACCUMULATE_GRAD = "torch::autograd::AccumulateGrad"


class NodeTag:
    """Lives in ``node.metadata``; its finalizer runs when the node is destroyed."""

    __slots__ = ("record", "recorder", "mark")

    def __init__(self, record: NodeRecord, recorder: Recorder) -> None:
        self.record = record
        self.recorder = recorder
        self.mark = -1  # id of the last walk that visited the node

    def __del__(self) -> None:
        try:
            self.recorder.node_died(self.record)
        except Exception:  # never raise from a finalizer
            pass


@dataclass(slots=True)
class _NodeType:
    """What we cache per autograd node class (``dir()`` is slow)."""

    op: str
    is_accumulate_grad: bool
    saved_attrs: tuple[str, ...]


_TYPES: dict[type, _NodeType] = {}


def _node_type(node: Any) -> _NodeType:
    cls = type(node)
    info = _TYPES.get(cls)
    if info is None:
        op = node.name()
        saved = tuple(a for a in dir(node) if a.startswith("_raw_saved_"))
        info = _TYPES[cls] = _NodeType(op, op == ACCUMULATE_GRAD, saved)
    return info


def _saved_data(node: Any, info: _NodeType) -> Iterator[Any]:
    """What each saved-tensor slot of a node holds: our handle, a user hook's object, a tensor, or None."""
    for attr in info.saved_attrs:
        try:
            value = getattr(node, attr)
        except RuntimeError:
            continue
        for saved in value if isinstance(value, tuple) else (value,):
            yield getattr(saved, "data", None)


def saved_handles(node: Any, info: _NodeType | None = None) -> Iterator[SavedHandle]:
    """The graphwatch handles among a node's saved tensors (none once they are freed)."""
    for data in _saved_data(node, info or _node_type(node)):
        if type(data) is SavedHandle:
            yield data


def node_record(node: Any) -> NodeRecord | None:
    """The record graphwatch attached to ``node``, or None if no walk has reached it."""
    try:
        tag = node.metadata.get(METADATA_KEY)
    except (AttributeError, RuntimeError):
        return None
    return tag.record if isinstance(tag, NodeTag) else None


@dataclass(slots=True)
class WalkResult:
    """What one walk saw; the caller copies what it needs into a BackwardRecord."""

    nodes_reached: int = 0
    earlier_nodes_reached: int = 0
    earlier_steps: set[int] = field(default_factory=set)
    crossings: list[tuple[int, int]] = field(default_factory=list)
    freed: list[NodeRecord] = field(default_factory=list)  # nodes reached whose buffers are freed
    params_reached: list[Any] = field(default_factory=list)  # leaf tensors with AccumulateGrad


_marks = iter(range(1 << 62))


def _tag(recorder: Recorder, node: Any, info: _NodeType) -> NodeTag:
    record = recorder.new_node(info.op, node._sequence_nr())
    for handle in _saved_data(node, info):
        if type(handle) is not SavedHandle:
            if handle is not None and not isinstance(handle, torch.Tensor):
                recorder.trace.untracked_saved += 1  # packed by a user's saved-tensor hooks inside ours
            continue
        handle.node = record
        handle.record.node = record.id
        record.saved.append(handle.record.id)
        if record.site is None:
            record.site = handle.record.site
    if record.site is None:  # saves nothing: the line of the last pack at or before it
        record.site = recorder.clock.site_of(record.seq)
        record.site_inferred = record.site is not None
    tag = NodeTag(record, recorder)
    node.metadata[METADATA_KEY] = tag
    return tag


def walk(
    recorder: Recorder,
    roots: Iterable[Any],
    backward_id: int | None = None,
    collect_params: bool = False,
    reached: set[int] | None = None,
) -> WalkResult:
    """Visit every node reachable from ``roots`` once; tag new ones; note steps crossed.

    ``backward_id``: the walk precedes that backward, which will run through
    the nodes.  A crossing is an edge from a node of this step into one of an
    earlier step that an earlier backward already ran through (a graph handed
    from one step to the next before any backward, as in a GAN, is not one).
    ``reached`` collects the record ids visited.  The walk does not descend
    below a node whose saved tensors a backward already freed: that part of
    the graph can no longer be backwarded.
    """
    result = WalkResult()
    mark = next(_marks)
    step = recorder.step
    backwards = recorder.trace.backwards
    stack: list[tuple[Any, NodeRecord | None]] = [(root, None) for root in roots if root is not None]
    while stack:
        node, parent = stack.pop()
        info = _node_type(node)
        if info.is_accumulate_grad:
            if collect_params:
                result.params_reached.append(node.variable)
            continue
        metadata = node.metadata
        tag = metadata.get(METADATA_KEY)
        if tag is None:
            tag = _tag(recorder, node, info)
        elif tag.mark == mark:
            continue
        tag.mark = mark
        record = tag.record
        result.nodes_reached += 1
        if reached is not None:
            reached.add(record.id)
        if record.step < step:
            result.earlier_steps.add(record.step)
            if record.backward is not None and backwards[record.backward].step < step:
                result.earlier_nodes_reached += 1
                if parent is not None and parent.step == step:
                    result.crossings.append((parent.id, record.id))
        if backward_id is not None:
            record.backward = backward_id
        if record.freed_by is not None:
            result.freed.append(record)
            continue
        for child, _ in node.next_functions:
            if child is not None:
                stack.append((child, record))
    return result


def path_to(roots: Iterable[Any], target: NodeRecord) -> list[NodeRecord]:
    """Records on one path from a root to the node tagged with ``target`` (root first), or []."""
    parents: dict[int, int | None] = {}
    records: dict[int, NodeRecord] = {}
    queue = [(root, None) for root in roots if root is not None]
    while queue:
        next_queue = []
        for node, parent_id in queue:
            record = node_record(node)
            if record is None or record.id in parents:
                continue
            parents[record.id] = parent_id
            records[record.id] = record
            if record is target or record.id == target.id:
                path = [record]
                while parents[path[-1].id] is not None:
                    path.append(records[parents[path[-1].id]])
                return path[::-1]
            next_queue.extend((child, record.id) for child, _ in node.next_functions if child is not None)
        queue = next_queue
    return []
