"""Records of a graph made on a step seen light, built when they are needed from the graph still alive.

On a light step (:mod:`.detail`) no pack hook runs and no walk tags the
graph.  When that graph matters later (a backward through it fails, a
suspicious backward or a holder census walks it) its records are built from
what torch still holds (:func:`~graphwatch.capture.graph.graph_walk.walk` calls in
here for a node no walk tagged):

- its step, from its sequence number (the step clock marks light steps too);
  its line is unknown, and the record says none rather than guess;
- its saved tensors, read from the node (``_raw_saved_x.data`` is the tensor
  itself when no hook packed it): bytes, kind, shape, counted alive from then
  until the node dies or a backward is seen to have freed them;
- whether a backward freed them (the slot reads None then), and which one
  (:meth:`LightBackwards.freeing`): each backward of a light step keeps weak
  references to the tensors it started from, so that a later look can tell
  whether it ran through the node.

Example::

    >>> import torch
    >>> from graphwatch.capture.recorder import Recorder
    >>> recorder = Recorder()
    >>> y = (torch.ones(3, requires_grad=True) * 2).exp()
    >>> [(s.kind, s.nbytes) for s in saved_tensors(recorder, y.grad_fn, step=0)]  # exp saves its output
    [('activation', 12)]
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ...model import SavedRecord
from ..hooks.saved_views import SavedTensor, raw_data
from .node_types import node_type

if TYPE_CHECKING:
    from ...model import Trace
    from ...model.packed import PackedArray

RECENT_BACKWARDS = 64  # light backwards whose roots are remembered (and looked through for a freeing one)
SEARCH_LIMIT = 100_000  # nodes one look through a backward's graph visits at most


class PostHocRecorder(Protocol):
    """What reading after the fact needs from the recorder (:class:`~graphwatch.capture.recorder.Recorder` is one)."""

    trace: Trace
    backward_starts: PackedArray

    def post_hoc_saved(self, tensor: torch.Tensor, step: int, output: bool = False) -> SavedRecord: ...


def plain_saved(node: Any, attrs: tuple[str, ...]) -> Iterator[tuple[torch.Tensor, bool]]:
    """(tensor, whether the op saved its own output) for each saved-tensor slot of a node that no hook packed
    and no backward freed (slots that hold a hook's object are left out).  Built-in nodes name a saved output
    ``result`` (``result0``, ...): stored without its ``grad_fn``, it reads like a leaf."""
    for attr in attrs:
        try:
            value = getattr(node, attr)
        except RuntimeError:
            continue
        output = attr.startswith("_raw_saved_result")
        for saved in value if isinstance(value, tuple) else (value,):
            if type(saved) is SavedTensor:
                data = raw_data(saved)
                if isinstance(data, torch.Tensor):
                    yield data, output


def saved_tensors(recorder: PostHocRecorder, node: Any, step: int) -> list[SavedRecord]:
    """The SavedRecords of a node's saved tensors that no hook packed (its step's ``step``), built now and
    counted alive (:meth:`Recorder.post_hoc_saved`); none for the slots a backward freed."""
    return [recorder.post_hoc_saved(tensor, step, output) for tensor, output in plain_saved(node, node_type(node).saved_attrs)]


class LightBackwards:
    """The recent backwards that ran with no walk of their graph (on light steps): which of them freed a node's
    saved tensors can be told later, from their roots' sequence numbers and, while they live, the tensors each
    started from (weakly referenced by the recorder for every backward, ``Recorder.losses``).  A ring of the
    last :data:`RECENT_BACKWARDS`, each (backward id, its roots' sequence numbers): a light backward's cost is
    one entry written; the backwards by root are indexed when an explanation first asks after a change."""

    def __init__(self, losses: dict[int, list[weakref.ref]]) -> None:
        self._losses = losses
        self._ring: list[tuple[int, tuple[int, ...]] | None] = [None] * RECENT_BACKWARDS
        self._by_root: dict[int, list[int]] | None = {}  # root sequence number -> backwards (None: to index)
        # while a look runs (:meth:`looking`): backward id -> the nodes below its roots, by id (None: more than
        # SEARCH_LIMIT), each node held, so that its id is its own until the look ends
        self._below: dict[int, dict[int, Any] | None] | None = None

    @contextmanager
    def looking(self) -> Iterator[None]:
        """A look at many nodes at once (a holder census): the graph below a backward's roots is walked once for
        all of them, not once for each, and let go when the look ends."""
        if self._below is not None:  # (a look inside a look: the outer one lets go)
            yield
            return
        self._below = {}
        try:
            yield
        finally:
            self._below = None

    def started(self, backward_id: int, roots: list[Any]) -> None:
        """Backward ``backward_id`` starts from ``roots``, unwalked."""
        seqs = (roots[0]._sequence_nr(),) if len(roots) == 1 else tuple(root._sequence_nr() for root in roots)
        self._ring[backward_id % RECENT_BACKWARDS] = (backward_id, seqs)
        self._by_root = None

    def _index(self) -> dict[int, list[int]]:
        """The remembered backwards by the sequence number of each of their roots, in the order they ran."""
        if self._by_root is None:
            self._by_root = {}
            for backward_id, seqs in sorted(entry for entry in self._ring if entry is not None):
                for seq in seqs:
                    self._by_root.setdefault(seq, []).append(backward_id)
        return self._by_root

    def started_from(self, recorder: PostHocRecorder, seq: int) -> int | None:
        """A remembered light backward that started from the node numbered ``seq`` and did not fail: the first
        that freed the graph, else the first (None: none did)."""
        backwards = recorder.trace.backwards
        ran = [b for b in self._index().get(seq, ()) if backwards[b].error is None]
        return next((b for b in ran if not backwards[b].retain_graph), ran[0] if ran else None)

    def freeing(self, recorder: PostHocRecorder, node: Any, seq: int) -> tuple[int | None, bool]:
        """(the earlier backward that freed ``node``'s saved tensors, when it can be told; whether one can have)
        (``seq``: the node's sequence number).

        Only a backward that started after the node was made, did not retain the graph and did not fail can
        have freed them, and only one that ran no walk (a walk would have tagged the node).  Of those, the one
        that started from the node itself, or whose starting tensors (still alive) reach it; else the only one
        whose tensors are gone.  When none can have, the backward failing now freed them on its way.
        """
        backwards = recorder.trace.backwards
        first = recorder.backward_starts.bisect_right(seq)
        remembered = sorted(entry for entry in self._ring if entry is not None and entry[0] >= first)
        unknown = []
        for backward_id, seqs in remembered:
            record = backwards[backward_id]
            if record.retain_graph or record.create_graph or record.error is not None:
                continue
            if seq in seqs:
                return backward_id, True
            reached = self._reaches(backward_id, node, seq)
            if reached:
                return backward_id, True
            if reached is None:
                unknown.append(backward_id)
        oldest = min((entry[0] for entry in self._ring if entry is not None), default=len(backwards))
        forgotten = first < oldest  # light backwards since the node that are no longer remembered
        return (unknown[0] if len(unknown) == 1 else None), bool(unknown) or forgotten

    def ran_through(self, recorder: PostHocRecorder, node: Any, seq: int) -> bool | None:
        """Whether a backward that ran with no walk went through ``node`` (numbered ``seq``; a step seen light
        made it): True when one started from it or its starting tensors (still alive) reach it, False when
        every one since the node was made is remembered and its tensors, alive, do not reach it; None when
        that cannot be told (a holder's fix then takes it as backwarded: no detach that could change what
        trains)."""
        backwards = recorder.trace.backwards
        first = recorder.backward_starts.bisect_right(seq)
        # a light backward since then that is no longer remembered was replaced by one at least a ring later
        forgotten = any(entry is not None and entry[0] - RECENT_BACKWARDS >= first for entry in self._ring)
        told: bool | None = None if forgotten else False
        for entry in self._ring:
            if entry is None or entry[0] < first or backwards[entry[0]].error is not None:
                continue
            reached = seq in entry[1] or self._reaches(entry[0], node, seq)
            if reached:
                return True
            if reached is None:
                told = None
        return told

    def roots_alive(self, backward_id: int) -> list[Any]:
        """The root nodes of a light backward whose starting tensors are all still alive ([] otherwise)."""
        tensors = [ref() for ref in self._losses.get(backward_id, ())]
        alive = [t for t in tensors if t is not None]
        if not tensors or len(alive) < len(tensors):
            return []
        return [t.grad_fn for t in alive if t.grad_fn is not None]

    def _reaches(self, backward_id: int, target: Any, seq: int) -> bool | None:
        """Whether the graph below backward ``backward_id``'s tensors reaches ``target`` (None: they are gone)."""
        roots = self.roots_alive(backward_id)
        if not roots:
            return None
        if self._below is not None:
            if backward_id not in self._below:
                self._below[backward_id] = _nodes_below(roots)
            below = self._below[backward_id]
            if below is not None:  # (every node the walk below could meet: the same answer)
                return below.get(id(target)) is target
        stack, seen = roots, set[int]()
        while stack and len(seen) < SEARCH_LIMIT:
            node = stack.pop()
            if node is target:
                return True
            if id(node) in seen or node._sequence_nr() < seq:  # (a node links only to nodes made before it)
                continue
            seen.add(id(node))
            stack.extend(child for child, _ in node.next_functions if child is not None)
        return False


def _nodes_below(roots: list[Any]) -> dict[int, Any] | None:
    """Every node below ``roots`` (themselves included) by id, each held; None when they are more than
    :data:`SEARCH_LIMIT` (a look then walks towards each node, as outside a look)."""
    found: dict[int, Any] = {}
    stack = list(roots)
    while stack:
        node = stack.pop()
        if id(node) in found:
            continue
        if len(found) >= SEARCH_LIMIT:
            return None
        found[id(node)] = node
        stack.extend(child for child, _ in node.next_functions if child is not None)
    return found
