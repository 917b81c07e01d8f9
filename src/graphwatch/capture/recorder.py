"""The recorder: turns capture events into the plain records of a Trace.

It is the only mutable state of a session.  Hooks call into it from the hot
path (pack, unpack, finalizers), so its per-event methods do constant work;
anything proportional to the graph happens in graph walks at backward time
and at step ends.

Example::

    >>> from graphwatch.capture.recorder import Recorder
    >>> recorder = Recorder()
    >>> recorder.step, len(recorder.trace.steps)
    (0, 0)
"""

from __future__ import annotations

import platform
import threading
import time
import weakref
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import torch

from ..model import BackwardRecord, NodeRecord, SavedRecord, StepRecord, Trace
from ..model.columns import freeze_steps
from ..model.packed import PackedArray
from ..model.trace import averaged_steps
from .graph.node_tags import NodeGroups
from .graph.post_hoc import LightBackwards
from .hooks.optimizer import OptimizerSteps
from .lines.callsite import SiteTable
from .lines.line_templates import LineTemplates
from .lines.step_clock import StepClock, next_sequence_nr
from .steps.live_steps import OLD_BATCH, LiveSteps
from .steps.resident import ResidentMemory

if TYPE_CHECKING:
    from .graph.node_tags import NodeTag
    from .hooks.saved import SavedHandle

# Per-node records are kept for this many most recent steps (plus steps with findings).
DEFAULT_KEEP_STEPS = 20
# Settled steps go into columns this many at a time: one pass over hot code, not a cold one per step.
FREEZE_BATCH = 256
# Saved tensors of one step tracked one by one at the default level; later ones are only counted, so that one
# backward through a graph of millions of nodes holds graphwatch to a fraction of torch's own memory.
TRACKED_PER_STEP = 100_000
_NO_TABLE: dict[int, int] = {}  # a settled step's tables: empty (shared, never written to)
RSS_EVERY = 8  # steps seen light read the resident memory on every this many steps
FORGET_EVERY = 64  # the step clock's old line changes are trimmed at every this many pruned steps


class Recorder:
    """Accumulates a :class:`~graphwatch.model.Trace` from hook events."""

    def __init__(self, keep_steps: int = DEFAULT_KEEP_STEPS) -> None:
        self.trace = Trace(
            torch_version=torch.__version__,
            python_version=platform.python_version(),
            started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        )
        self.sites = SiteTable(self.trace.sites)
        self.keep_steps = keep_steps
        self.precise = False  # lines come from a CallSiteMode (the precise level)
        self.detail_always = False  # build every record at once (the precise level), not when needed
        self.tracked_per_step = TRACKED_PER_STEP  # saved tensors of one step tracked one by one (default level)
        self.thread = threading.get_ident()
        self.clock = StepClock()
        self.step = 0
        self.current = StepRecord(index=0, source="explicit")
        self.step_started = time.perf_counter()
        # the process's CPU time when the current step started; None where it was not read (a system call of 1-2 us:
        # read where a step seen in full detail begins or ends, :meth:`cpu_clock_from_here`)
        self.step_started_cpu: float | None = time.process_time()
        self.step_seq = self.clock.mark()
        self.backward: BackwardRecord | None = None  # the backward running now, if any
        self.backward_starts = PackedArray("q")  # per backward id: the next node sequence number when it started
        self.backwards_begun = 0  # len(backward_starts), kept (an optimizer step reads it)
        self.is_full_step: Callable[[int], bool] = lambda step: True  # was a step seen in full detail (the plan)
        # the tensors the last backwards started from, weakly, by backward id (kept by the session's BackwardWatch)
        self.losses: dict[int, list[weakref.ref]] = {}
        self.light_backwards = LightBackwards(self.losses)  # backwards that ran with no walk (light steps)
        self.run_through: list[NodeTag] = []  # tags with saved tensors read after the fact, in this backward's graph
        self.templates: LineTemplates | None = None  # full steps' lines by node offset, for light steps' nodes
        self.step_ops: list[tuple[int, str]] = []  # (sequence number, op) of this step's nodes its walks met
        self.boundary_pending = False  # a freeing backward ended the step; commit at the next pack
        self.pending_source = "backward"
        self._pending_seq = 0
        self.boundary_hook: Callable[[str], object] = self.end_step  # the session wraps end_step
        self.kept_steps: set[int] = {0}  # steps whose per-node detail survives pruning
        self.cuda_seen = False
        self._next_saved = 0
        self._next_node = 0
        self.dtype_names: dict[torch.dtype, str] = {}
        # storage key -> [handles alive, bytes, step, is_activation]
        self._storages: dict[tuple, list] = {}
        self.live = LiveSteps()  # nodes and activation bytes alive, by step
        self.groups = NodeGroups()  # the quick walks' node groups alive, recounted at step ends
        self._live_leaf = 0
        self._node_ids_by_step: dict[int, list[int]] = {}
        self._saved_ids_by_step: dict[int, list[int]] = {}
        self._fresh: list[weakref.ref] = []  # this step's handles: those alive at its end get records
        self._post_hoc: dict[int, tuple | None] = {}  # saved records read from a light step's nodes -> storage key
        self._settled: list[int] = []  # pruned steps waiting to go into columns
        self._site_seq = -1  # node sequence number at the last pack-site lookup, and its result
        self._op_site: int | None = None
        self.closed = False
        self._rss = ResidentMemory()
        self._rss_read = 0
        self.optimizer_steps = OptimizerSteps()  # what changed parameters in place, for the inplace error's hint
        # explains a failed version check (the session's: it finds the line that changed the tensor); its text
        # follows torch's message
        self.inplace_explainer: Callable[[SavedHandle, torch.Tensor], str | None] | None = None

    # --------------------------------------------------------------- nodes
    def node_born(self, step: int, count: int = 1) -> None:
        """A walk tagged ``count`` nodes of ``step``: they count as alive until their tags die."""
        self.live.node_born(step, count)

    def nodes_died(self, step: int, count: int) -> None:
        """``count`` nodes of a quick walk's group died (:class:`~graphwatch.capture.graph.node_tags.NodeGroup`)."""
        if not self.closed:
            self.live.node_died(step, count)

    def node_record(self, tag: NodeTag, op: str) -> NodeRecord:
        """The NodeRecord of a tagged node, kept in the trace while its step is in the detail window."""
        record = NodeRecord(self._next_node, op, tag.step, tag.seq, backward=tag.backward)
        self._next_node += 1
        if self.templates is not None and tag.step == self.step:
            self.step_ops.append((tag.seq, op))
        self._keep_in_window(tag.step, record, self.trace.nodes, self._node_ids_by_step)
        return record

    def _keep_in_window(self, step: int, record: NodeRecord | SavedRecord, table: dict, ids_by_step: dict) -> None:
        """Put a record in the trace while its step is in the detail window (:meth:`_prune` takes it out)."""
        if step >= self.step - self.keep_steps or step in self.kept_steps:
            table[record.id] = record
            ids_by_step.setdefault(step, []).append(record.id)

    def node_died(self, tag: NodeTag) -> None:
        """Called by a node tag's finalizer: the autograd node was destroyed."""
        if self.closed:
            return
        self.live.node_died(tag.step)
        if tag.record is not None:
            tag.record.died_step = self.step
        if tag.post_hoc:
            self.post_hoc_released(tag.post_hoc, None)

    def dtype_name(self, dtype: torch.dtype) -> str:
        name = self.dtype_names.get(dtype)
        if name is None:
            name = self.dtype_names[dtype] = str(dtype).replace("torch.", "")
        return name

    # ------------------------------------------------------- saved tensors
    def pack_site(self) -> int | None:
        """The user line of the op that is saving a tensor now (called from the pack hook).

        Looked up once per op: the packs of one op all see the same next node
        sequence number, and any other op that saves makes a node first.
        """
        seq = next_sequence_nr()
        if seq != self._site_seq:
            self._site_seq = seq
            self._op_site = self.sites.here(4)  # here <- pack_site <- _new_handle <- pack <- the op's caller
            if not self.precise:  # the precise level notes lines per call instead
                self.clock.note_site(self._op_site, seq - 1)
        return self._op_site

    def saved_packed(self, handle: SavedHandle) -> None:
        """Count a new saved tensor: its storage's bytes are live until every handle on it is released."""
        current = self.current
        current.saved_packed += 1
        self._fresh.append(weakref.ref(handle))
        key, step, activation = handle.storage, handle.step, handle.kind != "parameter"
        if key is not None:
            entry = self._storages.get(key)
            if entry is not None:
                entry[0] += 1
                handle.nbytes = 0  # the storage is already counted
                if entry[2] < step:  # a newer graph keeps it alive now: count it there
                    self._count_live(-entry[1], entry[2], entry[3])
                    entry[2] = step
                    self._count_live(entry[1], step, entry[3])
                return
            self._storages[key] = [1, handle.nbytes, step, activation]
            if key[1]:
                self.cuda_seen = True
        current.saved_bytes_packed += handle.nbytes
        self._count_live(handle.nbytes, step, activation)

    def saved_counted(self) -> None:
        """Count a saved tensor past the step's :attr:`tracked_per_step`: no lifetime, bytes or record."""
        self.current.saved_packed += 1
        self.current.saved_counted_only += 1

    def counts_only(self) -> bool:
        """Whether the current step saved its budget of tracked tensors (the precise level has none)."""
        return self.current.saved_packed >= self.tracked_per_step and not self.detail_always

    def saved_record(self, handle: SavedHandle, tensor: torch.Tensor | None = None) -> SavedRecord:
        """The SavedRecord of a handle, built on first use from the handle and its alias (or ``tensor``)."""
        record = handle.record
        if record is not None:
            return record
        alias: Any = handle.alias if tensor is None else tensor
        record = handle.record = SavedRecord(
            self._next_saved,
            handle.step,
            handle.site,
            handle.nbytes,
            handle.kind,
            alias.shape,
            self.dtype_names.get(alias.dtype) or self.dtype_name(alias.dtype),
            "cpu" if alias.is_cpu else alias.device.type,
            unpacked=handle.unpacks,
        )
        self._next_saved += 1
        self._keep_in_window(handle.step, record, self.trace.saved, self._saved_ids_by_step)
        return record

    def post_hoc_saved(self, tensor: torch.Tensor, step: int, output: bool = False) -> SavedRecord:
        """The record of a tensor a node of a light step saved with no hook (read from the node now; ``output``:
        the op's own output), counted alive until :meth:`post_hoc_released` (:mod:`~graphwatch.capture.graph.post_hoc`)."""
        base = None if output else tensor._base
        if output:
            kind = "activation"
        elif base is not None:  # a view (``weight.t()``): its own is_leaf is not read, which would rebuild the
            # autograd node of a view whose base changed in place since (an optimizer's step): a node made here
            kind = ("parameter" if base.requires_grad else "input") if base.is_leaf else "activation"
        elif tensor.is_leaf:
            kind = "parameter" if tensor.requires_grad else "input"
        else:
            kind = "activation"
        try:
            untyped = tensor.untyped_storage()
            key: tuple | None = (untyped.data_ptr(), tensor.is_cuda)
            nbytes = untyped.nbytes()
        except (RuntimeError, NotImplementedError, TypeError):  # sparse, nested or storage-less
            key, nbytes = None, 0
        shape = () if tensor.is_nested else tuple(tensor.shape)
        device = "cpu" if tensor.is_cpu else tensor.device.type
        record = SavedRecord(self._next_saved, step, None, nbytes, kind, shape, self.dtype_name(tensor.dtype), device)
        self._next_saved += 1
        self._keep_in_window(step, record, self.trace.saved, self._saved_ids_by_step)
        self._post_hoc[record.id] = key
        if key is not None:
            entry = self._storages.get(key)
            if entry is not None:
                entry[0] += 1
                record.nbytes = 0  # the storage is counted already
                return record
            self._storages[key] = [1, nbytes, step, kind != "parameter"]
        self._count_live(nbytes, step, kind != "parameter")
        return record

    def post_hoc_released(self, records: list[SavedRecord], backward: int | None) -> None:
        """Saved tensors recorded after the fact were freed (by ``backward``) or their node died."""
        for record in records:
            if record.id not in self._post_hoc:
                continue
            key = self._post_hoc.pop(record.id)
            record.freed_step, record.freed_by = self.step, backward
            if key is None:
                self._count_live(-record.nbytes, record.step, record.kind != "parameter")
                continue
            entry = self._storages[key]
            entry[0] -= 1
            if not entry[0]:
                del self._storages[key]
                self._count_live(-entry[1], entry[2], entry[3])

    def _count_live(self, nbytes: int, step: int, activation: bool) -> None:
        if not nbytes:  # also keeps finalizers from adding keys while a step end iterates the table
            return
        if activation:
            self.live.count_bytes(nbytes, step)
        else:
            self._live_leaf += nbytes

    def saved_released(self, handle: SavedHandle) -> None:
        """Called by a handle's finalizer: autograd let go of the saved tensor."""
        if self.closed:  # after the session: the trace keeps what was alive at its end
            return
        backward = self.backward
        if backward is not None:
            backward.saved_freed += 1
            if handle.site is not None:  # a training forward's line (what an evaluation fix must not wrap)
                self.trace.sites[handle.site].backwarded = True
        record = handle.record
        if record is not None:
            record.freed_step = self.step
            if backward is not None:
                record.freed_by = backward.id
                if handle.node is not None:
                    handle.node.freed_by = backward.id
        key = handle.storage
        if key is None:
            nbytes, step, activation = handle.nbytes, handle.step, handle.kind != "parameter"
        else:
            entry = self._storages[key]
            entry[0] -= 1
            if entry[0]:
                return
            del self._storages[key]
            _, nbytes, step, activation = entry
        if backward is not None:
            backward.bytes_freed += nbytes
        self._count_live(-nbytes, step, activation)

    # --------------------------------------------------------------- steps
    def request_boundary(self, source: str) -> None:
        """End the step at the next forward op (a freeing backward with no other step marker).

        The step clock is marked now, so nodes made from here on belong to the
        next step; the step's totals are taken when it is committed.
        """
        if not self.boundary_pending:
            self.boundary_pending = True
            self._pending_seq = self.clock.mark()
        self.pending_source = source

    def cpu_clock_from_here(self) -> None:
        """The current step is seen in full detail: its CPU time counts from now, unless its start was read."""
        if self.step_started_cpu is None:
            self.step_started_cpu = time.process_time()

    def made_since_boundary(self, roots: list) -> bool:
        """Whether any of these nodes was made after the pending step boundary."""
        first = self._pending_seq
        for root in roots:  # (a loop, not any() over a generator: every backward of a step seen light asks)
            if root._sequence_nr() >= first:
                return True
        return False

    def nodes_made(self) -> int:
        """Autograd nodes (of this thread) made since the current step started, up to its end if one is pending."""
        return (self._pending_seq if self.boundary_pending else next_sequence_nr()) - self.step_seq

    def made_nothing_yet(self) -> bool:
        """Whether the step begun last (the next one, while a boundary is pending) has made no autograd node."""
        return next_sequence_nr() == (self._pending_seq if self.boundary_pending else self.step_seq)

    def commit_boundary(self) -> None:
        """End the pending step (called from the pack hook of the next forward op)."""
        self.boundary_hook(self.pending_source)

    def end_step(self, source: str, full: bool | None = None) -> StepRecord:
        """Close the current step with its totals and open the next one; ``full``: whether it was seen in full
        detail, where the caller knows (else :attr:`is_full_step` is asked)."""
        record = self.current
        record.source = source
        now = time.perf_counter()  # (this step's end is the next one's start)
        record.seconds = now - self.step_started
        if full is None:
            full = self.is_full_step(record.index)
        now_cpu = None  # the CPU time, where a step seen in full detail ends or (already begun) starts: measured there
        if full or (self.boundary_pending and self.is_full_step(record.index + 1)):
            now_cpu = time.process_time()
            if full and self.step_started_cpu is not None:
                record.cpu_seconds = now_cpu - self.step_started_cpu
        if self.boundary_pending:
            self.boundary_pending = False
            seq = self._pending_seq
        else:
            seq = self.clock.mark()
        record.nodes_created = max(0, seq - self.step_seq)
        if self.step_ops:  # (collected for the templates of full steps only)
            if full and self.templates is not None:
                self.templates.keep_step(self.clock, self.step_seq, seq, self.step_ops)
            self.step_ops = []
        if self._fresh:
            self._keep_outliving()
        self._snapshot_live(record, full)
        self.trace.steps.append(record)
        step = self.step = self.step + 1
        live = self.live
        if step - live.boundary >= 2 * OLD_BATCH:
            live.advance(step)
        self.current = StepRecord(index=step, source="explicit")
        self.step_seq = seq
        self.step_started, self.step_started_cpu = now, now_cpu
        if step > self.keep_steps:
            self._prune()
        return record

    def template_site(self, node: Any, seq: int, op: str, step: int) -> tuple[int | None, bool]:
        """(the line of a node of a step seen light, from a full step that ran the same code (or None); whether
        the node there packed a tensor, so that the line is its own)."""
        return (None, False) if self.templates is None else self.templates.node_site(self.clock, node, seq, op, step)

    def _keep_outliving(self) -> None:
        """Build the records of this step's saved tensors that outlive it (the others were counted only)."""
        fresh, self._fresh = self._fresh, []
        for ref in fresh:
            handle = ref()
            if handle is not None and handle.record is None:
                self.saved_record(handle)

    def _snapshot_live(self, record: StepRecord, full: bool) -> None:
        self.groups.recount(self.step)  # (at once when there is no group: a step that walked no graph)
        live = self.live
        record.nodes_alive_by_step, record.saved_alive_by_step = live.snapshot()
        record.live_activation_bytes = live.activation_total
        record.live_leaf_bytes = self._live_leaf
        record.live_nodes = live.nodes_total
        if full or not record.index % RSS_EVERY:
            self._rss_read = self._rss.bytes()
        record.rss_bytes = self._rss_read  # (a step seen light repeats the last reading, taken every few steps)
        if self.cuda_seen and torch.cuda.is_available():
            record.cuda_allocated = torch.cuda.memory_allocated()
            record.cuda_reserved = torch.cuda.memory_reserved()

    def saves_seen(self, step: int) -> bool:
        """Whether a saved tensor of ``step`` has a record (on a step seen light: one read after the fact)."""
        return bool(self._saved_ids_by_step.get(step))

    def recount_ended(self, record: StepRecord) -> None:
        """Add to the live tables of ``record``, the last step that ended, what a walk since its end (the
        session's last census) tagged of the graphs alive then: it was seen light, so its own graphs were not
        counted at its end.  A graph of a step up to it that is alive now was alive then; one counted then
        may have died since: each step's count is the larger of the two (what was made since belongs to no
        step of the trace)."""
        index = record.index
        for name, now in zip(("nodes_alive_by_step", "saved_alive_by_step"), self.live.snapshot()):
            then = getattr(record, name)
            steps = {s for s in now if s <= index} | set(then)
            setattr(record, name, {s: max(then.get(s, 0), now.get(s, 0)) for s in sorted(steps)})
        record.live_nodes = sum(record.nodes_alive_by_step.values())
        record.live_activation_bytes = sum(record.saved_alive_by_step.values())

    def keep_detail(self, step: int) -> None:
        """Keep per-node records of ``step`` in the trace (it has a finding)."""
        self.kept_steps.add(step)

    def _prune(self) -> None:
        cutoff = self.step - self.keep_steps
        if cutoff < 1 or (cutoff - 1) in self.kept_steps:
            return
        old = cutoff - 1
        trace = self.trace
        record = trace.steps.object_at(old)  # type: ignore[attr-defined]  # a RecordList
        if record is not None:
            record.detail = False
            # What grows with the number of graphs alive (a leak keeps more each step) goes with the
            # step's detail, so that every step past the window costs the same few bytes: the totals stay.
            record.nodes_alive_by_step = record.saved_alive_by_step = _NO_TABLE
            if record.holders:
                record.holders = []
            for backward_id in record.backwards:
                backward = trace.backwards.object_at(backward_id)  # type: ignore[attr-defined]  # a RecordList
                if backward is not None and backward.roots:
                    backward.roots = []  # node records that go with the detail
            settled = self._settled
            settled.append(old)  # numbers only now: into columns with the next batch
            if len(settled) >= FREEZE_BATCH:
                self._freeze_settled()
        if not old % FORGET_EVERY:  # (the timeline is trimmed in bulk: a few more old entries meanwhile)
            self.clock.forget_before(old + 1)
        if self._node_ids_by_step:
            for node_id in self._node_ids_by_step.pop(old, ()):
                trace.nodes.pop(node_id, None)
        if self._saved_ids_by_step:
            for saved_id in self._saved_ids_by_step.pop(old, ()):
                trace.saved.pop(saved_id, None)

    # ------------------------------------------------------------ in place
    def later_saves_of(self, handle: SavedHandle) -> int | None:
        """The site of the first save, after ``handle``'s, of the same storage at a newer version: an in-place
        op that saved its result (``relu_``) ran there."""
        if handle.storage is None:
            return None
        for ref in self._fresh:
            other = ref()
            if other is not None and other is not handle and other.storage == handle.storage and other.step == handle.step:
                alias = other.alias
                if alias is not None and other.version > handle.version and other.site is not None:
                    return other.site
        return None

    # ------------------------------------------------------------ backward
    def begin_backward(self, record: BackwardRecord) -> None:
        self.backwards_begun += 1
        self.backward_starts.append(next_sequence_nr())
        self.trace.backwards.append(record)
        self.current.backwards.append(record.id)
        self.backward = record

    def end_backward(self, record: BackwardRecord, seconds: float, cpu_seconds: float = 0.0) -> None:
        """The backward ``record`` returned after ``seconds`` of wall clock and ``cpu_seconds`` of the process's CPU."""
        record.seconds, record.cpu_seconds = seconds, cpu_seconds
        self.current.backward_seconds += seconds
        self.current.backward_cpu_seconds += cpu_seconds
        self.backward = None
        if self.run_through:
            run_through, self.run_through = self.run_through, []
            if not record.retain_graph and record.error is None:  # it freed what it ran through
                for tag in run_through:
                    if tag.post_hoc:
                        self.post_hoc_released(tag.post_hoc, record.id)
                        tag.post_hoc = None

    def _freeze_settled(self) -> None:
        freeze_steps(self.trace.steps, self.trace.backwards, self._settled)  # type: ignore[arg-type]  # RecordLists
        self._settled.clear()

    def close(self) -> None:
        """The session ended: put the settled steps into columns, release the file the recorder kept open."""
        self.groups.recount(self.step, everything=True)  # touched nodes counted exactly, for the stack give-back
        self.closed = True
        self._freeze_settled()
        self.trace.averaged_from, self.trace.averaged_before = averaged_steps(self.trace)
        self._rss.close()

    def has_live_nodes(self) -> bool:
        """Whether any node a walk touched is still alive."""
        return self.live.nodes_total > 0
