"""Walk an autograd graph without recursion, tagging each node and, where asked, recording it.

A node is tagged once, the first time a walk reaches it (see
:mod:`~graphwatch.capture.graph.node_tags`): :func:`quick_walk`, for a graph made
entirely in the current step, gives all its nodes one shared
:class:`~graphwatch.capture.graph.node_tags.NodeGroup`; :func:`walk` gives each node
it reaches a :class:`~graphwatch.capture.graph.node_tags.NodeTag` of its own and
also builds each node's :class:`~graphwatch.model.NodeRecord`, linked to the
saved tensors its pack hooks recorded (``node._raw_saved_<name>.data`` is the
handle the pack hook returned), so a node gets the step and line that created
it, and notes the steps the graph crosses.  Nothing here holds a node after
the walk returns.

Example::

    >>> import torch
    >>> from graphwatch.capture.recorder import Recorder
    >>> from graphwatch.capture.graph.graph_walk import walk, node_record
    >>> recorder = Recorder()
    >>> y = (torch.ones(2, requires_grad=True) * 2).sum()
    >>> walk(recorder, [y.grad_fn]).nodes_reached
    2
    >>> node_record(y.grad_fn).op
    'SumBackward0'
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch

from ...model import NodeRecord, StepSpans
from ..hooks.saved import SavedHandle
from ..hooks.saved_views import SavedTensor, raw_data, raw_unpack_hook
from ..lines.step_clock import next_sequence_nr
from .node_tags import METADATA_KEY, NodeGroup, NodeTag
from .node_types import NodeType, node_type, saved_data
from .post_hoc import saved_tensors

if TYPE_CHECKING:
    from ..recorder import Recorder

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
    nodes_counted_only: int = 0  # reached past the tracked budget: counted, not tagged
    earlier_nodes_reached: int = 0
    earlier_steps: set[int] = field(default_factory=set)
    crossings: list[tuple[int, int]] = field(default_factory=list)
    freed: list[NodeRecord] = field(default_factory=list)  # nodes reached whose buffers are freed
    params_reached: list[Any] = field(default_factory=list)  # leaf tensors with AccumulateGrad


_marks = iter(range(1 << 62))


def _new_tag(recorder: Recorder, metadata: dict, step: int, seq: int) -> NodeTag:
    tag = NodeTag(recorder, step, seq)
    metadata[METADATA_KEY] = tag
    recorder.node_born(step)
    return tag


def _record(
    recorder: Recorder, node: Any, info: NodeType, tag: NodeTag | NodeGroup | None, ran: int | None = None
) -> NodeTag:
    """Tag ``node`` (a tag of its own if a quick walk grouped it) and build its record, linked to its saved
    tensors; ``ran``: a backward known to have run through the node that led the walk here (its parent's)."""
    if tag is None or tag.recorder is not recorder:  # (another session's tag: a graph carried into this one)
        seq = node._sequence_nr()
        tag = _new_tag(recorder, node.metadata, recorder.clock.step_of(seq), seq)
    elif type(tag) is NodeGroup:
        tag = tag.split_off(node.metadata, node._sequence_nr())
    assert type(tag) is NodeTag
    record = tag.record = recorder.node_record(tag, info.op)
    for handle in saved_data(node, info):
        if type(handle) is not SavedHandle:
            if handle is not None and not isinstance(handle, torch.Tensor):
                recorder.trace.untracked_saved += 1  # packed by a user's saved-tensor hooks inside ours
            continue
        saved = recorder.saved_record(handle)
        handle.node = record
        saved.node = record.id
        record.saved.append(saved.id)
        if record.site is None:
            record.site = saved.site
    if record.site is None:  # saves nothing (or its saved tensors are gone): the line of the last pack before it
        record.site = recorder.clock.site_of(record.seq)
        record.site_inferred = record.site is not None and not (recorder.precise or recorder.clock.packed(record.seq))
        if tag.backward is not None and _buffers_freed(node, info):  # a quick walk's backward freed them
            record.freed_by = tag.backward
    if not record.saved and tag.step >= 0 and not recorder.is_full_step(tag.step):
        _record_after_the_fact(recorder, node, info, tag, record, ran)
    return tag


def _record_after_the_fact(
    recorder: Recorder, node: Any, info: NodeType, tag: NodeTag, record: NodeRecord, ran: int | None
) -> None:
    """A node of a step seen light (no pack hook ran): its saved tensors read from it now, which backward ran
    through it (``ran``, or the one that started from it), and whether they were freed, and by which backward
    (:mod:`~graphwatch.capture.graph.post_hoc`)."""
    backwards = recorder.trace.backwards
    if ran is None or backwards[ran].error is not None:
        ran = recorder.light_backwards.started_from(recorder, record.seq)
    if ran is not None and backwards[ran].api == "backward":  # (grad() runs only what its inputs need)
        record.backward = tag.backward = ran
    saved = saved_tensors(recorder, node, tag.step)
    if record.site is None:  # the template's line is the node's own where it packed there, as on a full step
        record.site, own = recorder.template_site(node, record.seq, info.op, tag.step)
        record.site_inferred = record.site is not None and not saved and not own
    for saved_record in saved:  # (saved by this node's op: its line, as a pack hook would have noted it)
        saved_record.node, saved_record.site = record.id, record.site
        record.saved.append(saved_record.id)
    tag.post_hoc = saved or None
    if _buffers_freed(node, info):
        _freed_after_the_fact(recorder, node, tag, record)


def _freed_after_the_fact(recorder: Recorder, node: Any, tag: NodeTag, record: NodeRecord) -> None:
    """A walk finds freed the saved tensors of a node of a step seen light: by the last backward known to have
    run through it, or the one :class:`~graphwatch.capture.graph.post_hoc.LightBackwards` tells; when no earlier
    backward can have, by the one failing now on its way (then the node is no stale part of the graph)."""
    backward = record.backward
    known = None if backward is None else recorder.trace.backwards[backward]
    running = recorder.backward.id if recorder.backward is not None else None
    if known is None or known.retain_graph or known.error is not None:
        backward, earlier = recorder.light_backwards.freeing(recorder, node, record.seq)
        if not earlier and running is not None:
            backward = running
    tag.freed = backward is None or backward != running
    if backward is not None:
        record.freed_by = record.backward = tag.backward = backward
    if tag.post_hoc:
        recorder.post_hoc_released(tag.post_hoc, backward)
        tag.post_hoc = None


def _buffers_freed(node: Any, info: NodeType) -> bool:
    """True if reading the node's saved tensors raises torch's "backward through the graph a second time".

    A slot still held by saved-tensor hooks is not read: reading it runs their unpack hook, and
    ``torch.utils.checkpoint``'s would recompute the forward.  Only slots that hold neither a packed object
    nor an unpack hook (freed ones, and undefined optional tensors) are read, which runs no hook.
    """
    for attr in info.saved_attrs:
        if _held_by_hooks(node, attr):
            continue
        try:
            getattr(node, "_saved_" + attr[len("_raw_saved_") :])
        except RuntimeError:
            return True
        except Exception:  # not a tensor slot torch can read back; look at the next
            continue
    return False


def _held_by_hooks(node: Any, attr: str) -> bool:
    """True if a saved-tensor slot holds what a pack hook returned, or an unpack hook (read without unpacking)."""
    try:
        value = getattr(node, attr)
    except RuntimeError:  # freed
        return False
    slots = value if isinstance(value, tuple) else (value,)
    return any(raw_data(s) is not None or raw_unpack_hook(s) is not None for s in slots if type(s) is SavedTensor)


def quick_walk(
    recorder: Recorder, roots: Iterable[Any], backward_id: int, collect_params: bool = False
) -> WalkResult | None:
    """Tag and count a graph made entirely in the current step, building no records.

    Every node it reaches gets the walk's one :class:`NodeGroup`.  Returns
    None as soon as it meets a node that an earlier walk tagged or that an
    earlier step made: that graph needs :func:`walk` (steps crossed, freed
    nodes, records).  Tags it left stay valid for that walk.  Past the
    recorder's ``tracked_per_step`` tags (the default level), nodes are
    counted and told apart by sequence number only: no tag, no metadata.
    """
    result = WalkResult()
    group = NodeGroup(recorder, recorder.step, backward_id)
    try:
        return _quick_walk(recorder, roots, group, result, collect_params)
    finally:
        group.born(result.nodes_reached - result.nodes_counted_only)


def _quick_walk(
    recorder: Recorder, roots: Iterable[Any], group: NodeGroup, result: WalkResult, collect_params: bool
) -> WalkResult | None:
    first_seq = recorder.step_seq
    params = result.params_reached
    ops = recorder.step_ops if recorder.templates is not None else None  # a full step's ops, for light steps
    made = next_sequence_nr() - first_seq  # nodes this step made: the walk reaches no others
    budget = made if recorder.detail_always else min(made, recorder.tracked_per_step)
    seen = bytearray(made if budget < made else 0)  # a byte per node of this step, when the budget can be reached
    stack = [root for root in roots if root is not None]
    while stack:
        node = stack.pop()
        info = node_type(node)
        if info.is_accumulate_grad:
            if collect_params:
                params.append(node.variable)
            continue
        if seen and result.nodes_reached >= budget:
            offset = node._sequence_nr() - first_seq
            if not 0 <= offset < len(seen):  # an earlier step's node (or another thread's): needs walk()
                return None
            if seen[offset]:
                continue
            seen[offset] = 1
            result.nodes_reached += 1
            result.nodes_counted_only += 1
            stack.extend(child for child, _ in node.next_functions if child is not None)
            continue
        metadata = node.metadata
        tag = metadata.get(METADATA_KEY)
        if tag is not None:
            if tag is group:
                continue
            return None
        seq = node._sequence_nr()
        if seq < first_seq:
            return None
        if seen and seq - first_seq < made:
            seen[seq - first_seq] = 1
        metadata[METADATA_KEY] = group
        result.nodes_reached += 1
        if ops is not None:
            ops.append((seq, info.op))
        for child, _ in node.next_functions:
            if child is not None:
                stack.append(child)
    return result


def _first_visit(recorder: Recorder, node: Any, mark: int, ran: int | None = None) -> NodeTag | None:
    """The tag of ``node``, its record built (and the node tagged) if need be, the first time a walk
    marked ``mark`` meets it; None when that walk has met it already.  (``ran``: as for :func:`_record`.)"""
    found: NodeTag | NodeGroup | None = node.metadata.get(METADATA_KEY)
    if found is None or found.record is None or found.recorder is not recorder:
        tag = _record(recorder, node, node_type(node), found, ran)
    else:
        tag = cast(NodeTag, found)  # (a tag with a record is a NodeTag)
        if tag.mark == mark:
            return None
        if tag.post_hoc and _buffers_freed(node, node_type(node)):  # freed since it was recorded
            _freed_after_the_fact(recorder, node, tag, cast(NodeRecord, tag.record))
    tag.mark = mark
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
    stack: list[tuple[Any, NodeRecord | None, int | None]] = [(root, None, None) for root in roots if root is not None]
    while stack:
        node, parent, ran = stack.pop()
        if node_type(node).is_accumulate_grad:
            if collect_params:
                result.params_reached.append(node.variable)
            continue
        tag = _first_visit(recorder, node, mark, ran)
        if tag is None:
            continue
        record = tag.record
        assert record is not None  # (_first_visit builds it)
        ran = record.backward  # (before this walk's backward takes its place)
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
            record.backward = tag.backward = backward_id
            if tag.post_hoc:  # its saved tensors, read after the fact: this backward may free them
                recorder.run_through.append(tag)
        if (record.freed_by is not None and record.freed_by != backward_id) or tag.freed:  # (not on its own way)
            result.freed.append(record)
            continue
        for child, _ in node.next_functions:
            if child is not None:
                stack.append((child, record, ran))
    return result


@dataclass(slots=True)
class Reach:
    """What the graph below one node holds, whichever later step looks at it: the steps whose nodes it
    reaches (as sorted, disjoint ``[start, end)`` spans: a graph kept since step 3 is one span however
    long the run), and how many of its nodes a backward ran through (before the step it was looked at
    in, and in that step).  A graph never changes below a node, so this is kept and reused by the next
    look (see :func:`reach`)."""

    step: int  # the step it was looked at in
    spans: list[tuple[int, int]] = field(default_factory=list)
    backwarded_before: int = 0
    backwarded_in_step: int = 0
    backward: int | None = None  # the root's backward when looked at: a later one makes this stale
    looked_at: int = 0  # nodes this look walked (the cost of the look)

    def add(self, other: Reach) -> None:
        """Add what ``other`` (looked at in an earlier step) reaches."""
        self.spans = _merge_spans(self.spans, other.spans)
        self.backwarded_before += other.backwarded_before + other.backwarded_in_step

    def earlier(self, step: int) -> tuple[StepSpans, int]:
        """(steps before ``step`` reached, nodes reached that a backward before ``step`` ran through)."""
        steps = StepSpans((start, min(end, step)) for start, end in self.spans if start < step)
        return steps, self.backwarded_before + (self.backwarded_in_step if step > self.step else 0)


def _merge_spans(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of two sorted lists of disjoint ``[start, end)`` spans, sorted, disjoint, touching ones joined."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(a + b):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def reach(recorder: Recorder, root: Any, known: dict[int, Reach]) -> tuple[int | None, Reach]:
    """(root's record id, what the graph below ``root`` holds), reusing ``known`` reaches by record id.

    Like :func:`walk`, it tags and records the nodes it meets and does not
    descend below freed nodes; below a node found in ``known`` it adds that
    reach instead of walking again, so looking at a graph that grew by one
    step since the last look costs what the step added (``total_loss +=
    loss`` looked at every step costs O(1), not O(steps)).  A node reached
    both inside and outside a reused part may be counted twice.
    """
    step = recorder.step
    result = Reach(step)
    if root is None:
        return None, result
    backwards = recorder.trace.backwards
    steps: set[int] = set()
    mark = next(_marks)
    root_record: NodeRecord | None = None
    stack: list[tuple[Any, int | None]] = [(root, None)]
    while stack:
        node, ran = stack.pop()
        if node_type(node).is_accumulate_grad:
            continue
        untagged = node.metadata.get(METADATA_KEY) is None
        tag = _first_visit(recorder, node, mark, ran)
        if tag is None:
            continue
        record = tag.record
        assert record is not None  # (_first_visit builds it)
        root_record = record if root_record is None else root_record
        result.looked_at += 1
        earlier = known.get(record.id)
        if earlier is not None and earlier.backward == record.backward and earlier.step < step:
            result.add(earlier)
            continue
        steps.add(record.step)
        if record.backward is not None:  # (a backward starting now is not in the trace yet: this step's)
            if record.backward < len(backwards) and backwards[record.backward].step < step:
                result.backwarded_before += 1
            else:
                result.backwarded_in_step += 1
        if record.freed_by is None and not tag.freed:
            stack.extend((child, record.backward) for child, _ in node.next_functions if child is not None)
        elif untagged:  # a freed graph of a step seen light: its nodes are alive all the same
            _count_untagged_below(recorder, node)
    if root_record is None:  # the root is an AccumulateGrad: a parameter holds no graph
        return None, result
    result.spans = _merge_spans(result.spans, [(s, s + 1) for s in steps])
    result.backward = root_record.backward
    return root_record.id, result


def _count_untagged_below(recorder: Recorder, node: Any) -> None:
    """Tag the untagged nodes below ``node`` (whose saved tensors a backward freed, first met now: a graph of a
    step seen light, which no walk tagged), each under the step that made it, so that the live tables count them
    as ``level="full"`` counts the nodes it tagged as they were made; nothing is recorded, and no walk result
    changes (:func:`reach` does not descend below freed nodes)."""
    stack = [child for child, _ in node.next_functions if child is not None]
    step_of = recorder.clock.step_of
    while stack:
        node = stack.pop()
        metadata = node.metadata
        if METADATA_KEY in metadata or node_type(node).is_accumulate_grad:
            continue
        seq = node._sequence_nr()
        _new_tag(recorder, metadata, step_of(seq), seq)
        stack.extend(child for child, _ in node.next_functions if child is not None)


def root_records(recorder: Recorder, roots: Iterable[Any]) -> list[int]:
    """Record ids of the tagged roots of a walked graph, building the records a quick walk left out."""
    ids = []
    for root in roots:
        tag = None if root is None else root.metadata.get(METADATA_KEY)
        if tag is not None:
            if tag.record is None or tag.recorder is not recorder:
                tag = _record(recorder, root, node_type(root), tag)
            assert tag.record is not None  # (_record builds it)
            ids.append(tag.record.id)
    return ids


def path_to(roots: Iterable[Any], target: NodeRecord) -> list[NodeRecord]:
    """Records on one path from a root to the node tagged with ``target`` (root first), or []."""
    parents: dict[int, int | None] = {}
    records: dict[int, NodeRecord] = {}
    queue: list[tuple[Any, int | None]] = [(root, None) for root in roots if root is not None]
    while queue:
        next_queue: list[tuple[Any, int | None]] = []
        for node, parent_id in queue:
            record = node_record(node)
            if record is None or record.id in parents:
                continue
            parents[record.id] = parent_id
            records[record.id] = record
            if record is target or record.id == target.id:
                path = [record]
                while (parent := parents[path[-1].id]) is not None:
                    path.append(records[parent])
                return path[::-1]
            next_queue.extend((child, record.id) for child, _ in node.next_functions if child is not None)
        queue = next_queue
    return []
