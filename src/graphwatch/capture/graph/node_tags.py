"""What graphwatch stores on an autograd node: a tag in ``node.metadata``, which lives exactly as long as the node.

Two kinds of tag, both with a ``record`` attribute (None until a full walk
builds the node's :class:`~graphwatch.model.NodeRecord`):

- :class:`NodeTag`, one per node: step, sequence number, last backward and
  record; its finalizer counts the node dead.
- :class:`NodeGroup`, one per quick walk: every node that walk tagged holds
  the same group (its step and backward).  A graph made and freed in one step,
  the common case, then costs one dict store per node and no object or
  finalizer per node.  The nodes' metadata dicts are the group's only holders,
  so the group dies with the last of its nodes; a node that dies before the
  others is counted off at the next step end (:class:`NodeGroups`).  A full
  walk that reaches a node of a group gives it a NodeTag of its own
  (:meth:`NodeGroup.split_off`).

Example::

    >>> import torch
    >>> from graphwatch.capture.recorder import Recorder
    >>> from graphwatch.capture.graph.graph_walk import quick_walk
    >>> recorder = Recorder()
    >>> y = (torch.ones(2, requires_grad=True) * 2).sum()
    >>> quick_walk(recorder, [y.grad_fn], backward_id=0).nodes_reached, recorder.live.nodes_total
    (2, 2)
    >>> type(y.grad_fn.metadata[METADATA_KEY]).__name__
    'NodeGroup'
    >>> del y
    >>> recorder.live.nodes_total
    0
"""

from __future__ import annotations

import sys
import weakref
from typing import TYPE_CHECKING, Protocol

from .stack_limit import TouchedNodes

if TYPE_CHECKING:
    from ...model import NodeRecord, SavedRecord

METADATA_KEY = "graphwatch"


class TagRecorder(Protocol):
    """What tags count nodes alive into (:class:`~graphwatch.capture.recorder.Recorder` is one)."""

    groups: NodeGroups

    def node_born(self, step: int, count: int = 1) -> None: ...
    def node_died(self, tag: NodeTag) -> None: ...
    def nodes_died(self, step: int, count: int) -> None: ...


class NodeTag:
    """One node's tag: its step, sequence number, the last backward that ran through it, and its record;
    for a node of a step seen light, the records of its saved tensors read after the fact (``post_hoc``,
    counted alive until the node dies) and whether a backward freed them (``freed``, by whom unknown)."""

    __slots__ = ("backward", "freed", "mark", "post_hoc", "record", "recorder", "seq", "step")

    def __init__(self, recorder: TagRecorder, step: int, seq: int) -> None:
        self.recorder = recorder
        self.step = step
        self.seq = seq
        self.backward: int | None = None  # id of the last backward whose walk visited the node
        self.mark = -1  # id of the last walk that visited the node
        self.record: NodeRecord | None = None
        self.post_hoc: list[SavedRecord] | None = None
        self.freed = False
        TouchedNodes.alive += 1

    def __del__(self) -> None:
        try:
            TouchedNodes.died()
            self.recorder.node_died(self)
        except Exception:  # never raise from a finalizer
            pass


class NodeGroup:
    """The shared tag of the nodes one quick walk tagged: made in ``step``, run through by ``backward``.

    ``counted`` is how many of them the live tables count under ``step``.
    """

    __slots__ = ("__weakref__", "backward", "counted", "recorder", "step")
    record: NodeRecord | None = None  # as a NodeTag's before a full walk: a grouped node has no record
    post_hoc: list[SavedRecord] | None = None  # (its nodes' saved tensors went through the pack hook)
    freed = False

    def __init__(self, recorder: TagRecorder, step: int, backward: int) -> None:
        self.recorder = recorder
        self.step = step
        self.backward = backward
        self.counted = 0

    def born(self, count: int) -> None:
        """The walk tagged ``count`` nodes with this group: count them alive."""
        if count:
            self.counted += count
            TouchedNodes.alive += count
            self.recorder.node_born(self.step, count)
            self.recorder.groups.add(self)

    def forget(self, count: int) -> None:
        """``count`` of the group's nodes died or left the group: count them off."""
        if count:
            self.counted -= count
            TouchedNodes.died(count)
            self.recorder.nodes_died(self.step, count)

    def split_off(self, metadata: dict, seq: int) -> NodeTag:
        """Give one node of the group (its ``metadata`` and sequence number) a NodeTag of its own."""
        tag = NodeTag(self.recorder, self.step, seq)  # (counts itself among the touched nodes)
        tag.backward = self.backward
        metadata[METADATA_KEY] = tag
        self.counted -= 1  # the live tables count it once still, now as the tag's
        TouchedNodes.died()
        return tag

    def __del__(self) -> None:
        try:
            self.forget(self.counted)
        except Exception:  # never raise from a finalizer
            pass


def _references(obj: object) -> int:
    return sys.getrefcount(obj)


def _calibrate() -> int:
    probe = object()  # held by this local only, as a group by the local of NodeGroups.recount
    return _references(probe)


_NOT_NODES = _calibrate()  # references to a group that are not its nodes' metadata dicts, when counted


class NodeGroups:
    """The groups alive, recounted at step ends: those of the last two steps each time, older ones (a loop that
    keeps every step's graph) once every ``old_every`` step ends, so a step end costs O(recent groups)."""

    def __init__(self, old_every: int = 256) -> None:
        self._recent: list[weakref.ref[NodeGroup]] = []
        self._old: list[weakref.ref[NodeGroup]] = []
        self._old_every = old_every
        self._ends = 0

    def add(self, group: NodeGroup) -> None:
        self._recent.append(weakref.ref(group))

    def recount(self, step: int, everything: bool = False) -> None:
        """At the end of ``step``: count off the nodes of groups that died before the rest of their group
        (``everything``: of the old groups too, as at the session's end)."""
        self._ends += 1
        old = everything or self._ends % self._old_every == 0
        if not old and not self._recent:  # (a step that walked no graph: nothing to recount)
            return
        recent: list[weakref.ref[NodeGroup]] = []
        kept_old: list[weakref.ref[NodeGroup]] = []
        for ref in self._recent + self._old if old else self._recent:
            group = ref()
            if group is None:
                continue
            alive = _references(group) - _NOT_NODES
            if alive < group.counted:  # (a walk still tagging it holds one more: never counted up here)
                group.forget(group.counted - alive)
            (recent if group.step >= step - 1 else kept_old).append(ref)
        self._recent = recent
        if old:
            self._old = kept_old
        else:
            self._old.extend(kept_old)
