"""What a session does with the graph of each backward: look at it, explain it when it fails, draw it.

Record cheaply, look closer on suspicion: a graph made entirely in the
current step by a backward that frees it gets a quick walk (node tags and
counts, no records).  The first backward, a retained or ``create_graph``
graph, a snapshot, the precise level, and any graph that reaches nodes an
earlier walk or step made get the full walk, which builds the records the
analysis reads; a first backward whose step saved more than
:data:`DRAW_SAVED_BOUND` tensors is not drawn (its snapshot says so) and gets
the quick walk, which holds a million-node graph's peak memory to about twice
bare torch's.  When torch raises "backward through the graph a second time",
the full walk's freed nodes name the stale part of the graph.

Example::

    >>> import torch, graphwatch
    >>> x = torch.ones(2, requires_grad=True)
    >>> with graphwatch.watch(summary=False) as gw:
    ...     for _ in range(3):
    ...         (x * 2).sum().backward()
    >>> [b.nodes_reached for b in gw.trace.backwards], [s.reason for s in gw.trace.snapshots]
    ([2, 2, 2], ['first backward'])
"""

from __future__ import annotations

import inspect
import sys
import weakref
from collections import deque
from collections.abc import Collection, Iterable, Mapping
from types import TracebackType
from typing import Any

import torch

from .analysis import FindingLog, explain_backward_twice
from .analysis.ddp_errors import ddp_finding
from .analysis.explain import handed_off
from .analysis.torch_errors import (
    carried_update,
    inplace_finding,
    is_leaf_inplace_error,
    is_non_scalar_error,
    leaf_inplace_finding,
    no_graph_finding,
    non_scalar_finding,
    unused_index,
    unused_input_finding,
)
from .capture import Recorder, frontier, path_to, quick_walk, root_records, walk
from .capture.causes.carriers import name_carrier
from .capture.causes.ddp_frames import find_ddp_cause
from .capture.causes.error_frames import engine_inputs, find_leaf_inplace, find_non_scalar, find_unused_input
from .capture.causes.held_values import attribute_items
from .capture.causes.holders import parameter_names
from .capture.causes.inplace import InplaceFinder
from .capture.causes.no_grad import find_no_grad
from .capture.causes.second_backward import CauseFinder
from .capture.hooks.optimizer import GradResetTracker
from .capture.hooks.saved import SavedHandle
from .capture.hooks.transforms import hide_from_compiler
from .capture.lines.frames import local_value, user_frames
from .capture.recorder import TRACKED_PER_STEP
from .errors import BackwardTwiceError, ExplainedError, LossWithoutGraphError, notify
from .model import BackwardRecord, Finding, NodeRecord, Snapshot, StepRecord

CROSSING = "graph crosses steps"  # the reason of the snapshot of the first graph that crosses steps
# a first backward whose step saved more tensors than this is not drawn: drawing it needs the full walk's
# records of every node (about 4x bare torch's memory on a 1M-node chain); it gets the quick walk instead.
# The same bound as the tensors a step tracks one by one: past it a step is counted, not recorded.
DRAW_SAVED_BOUND = TRACKED_PER_STEP
_REMEMBERED = 64  # backwards whose losses and parameters reached are remembered for an error's remedies
_CARRIERS_NAMED = 4  # distinct earlier nodes a crossing backward names the carrier of (the first crossings')


class BackwardWatch:
    """The graph work of a session's backwards; ``retained`` lists this step's retain_graph backwards."""

    def __init__(
        self,
        recorder: Recorder,
        log: FindingLog,
        grads: GradResetTracker,
        snapshots: str | frozenset[int],
        max_snapshots: int,
    ) -> None:
        self._recorder = recorder
        self._log = log
        self._grads = grads
        self._snapshots = snapshots  # "auto", "off" or step numbers
        self._max_snapshots = max_snapshots
        self._first_drawn = False  # the "first backward" snapshot was tried (drawn or not)
        self.retained: list[tuple[BackwardRecord, set[int]]] = []  # with the node records each reached
        self._started_at = recorder.backward_starts  # per backward id: the node sequence number when it started
        # the last optimizer steps: (backwards started before it, the optimizer), to tell who trains what
        self._recent_steps: deque[tuple[int, weakref.ref]] = deque(maxlen=32)
        # the last backwards' losses (weakly: a loss still alive at an error shows its whole graph; kept by the
        # recorder, whose records of a step seen light use them too) and the parameters each reached (``id()``s),
        # by backward id: what an error's remedies are made from
        self._losses = recorder.losses
        self._reached: dict[int, frozenset[int]] = {}
        recorder.inplace_explainer = self.explain_inplace

    def optimizer_stepped(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer.step()`` ran (after the backwards recorded so far)."""
        last = self._recent_steps[-1][1] if self._recent_steps else None
        ref = last if last is not None and last() is optimizer else weakref.ref(optimizer)  # (one per optimizer)
        self._recent_steps.append((self._recorder.backwards_begun, ref))

    def _stepped_after(self, backward: int) -> list[torch.optim.Optimizer]:
        """The optimizers of the first optimizer step after backward ``backward`` started."""
        after = [started for started, _ in self._recent_steps if started > backward]
        first = min(after, default=None)
        return [o for started, ref in self._recent_steps if started == first and (o := ref()) is not None]

    def started(self, record: BackwardRecord, outputs: Iterable[Any] = ()) -> None:
        """A backward of ``outputs`` (the tensors it starts from) starts (its record is the next in the trace;
        the recorder notes where the node numbers were, :meth:`Recorder.begin_backward`)."""
        try:
            self._losses[record.id] = [weakref.ref(t) for t in outputs if isinstance(t, torch.Tensor)]
        except TypeError:  # a tensor type without weak references: its graph is not looked at at an error
            self._losses[record.id] = []
        self._losses.pop(record.id - _REMEMBERED, None)
        self._reached.pop(record.id - _REMEMBERED, None)

    def walk_before(
        self, record: BackwardRecord, roots: list[Any], accumulate: bool, full: bool = False
    ) -> list[NodeRecord]:
        """Tag and count the graph the backward is about to run; return the nodes already freed.  ``full``:
        the full walk, whatever the graph (a backward that failed on a step seen light)."""
        recorder = self._recorder
        if not (
            full or record.retain_graph or record.create_graph or self.retained or recorder.detail_always
            or recorder.boundary_pending or self.wants_snapshot(record, False)
        ):  # fmt: skip
            quick = quick_walk(recorder, roots, record.id, collect_params=True)
            if quick is not None:
                record.nodes_reached = quick.nodes_reached
                record.nodes_counted_only = quick.nodes_counted_only
                record.roots = root_records(recorder, roots)  # a backward-twice error compares them
                self._reached_params(record, quick.params_reached, accumulate)
                return []
        reached: set[int] | None = set() if (record.retain_graph or self.retained) else None
        result = walk(recorder, roots, record.id, collect_params=True, reached=reached)
        record.nodes_reached = result.nodes_reached
        record.earlier_nodes_reached = result.earlier_nodes_reached
        record.earlier_steps = sorted(result.earlier_steps)
        record.crossings = result.crossings[:16]
        if not record.crossings and result.earlier_nodes_reached:  # entered through nodes no backward ran
            record.crossings = frontier(roots, record.step)
        if record.crossings:
            self._name_carrier(record)
        record.roots = root_records(recorder, roots)
        self._reached_params(record, result.params_reached, accumulate)
        if reached is not None:
            for earlier, earlier_reached in self.retained:
                if not earlier.graph_reused and earlier_reached & reached:
                    earlier.graph_reused = True
            if record.retain_graph:
                self.retained.append((record, reached))
        crosses = bool(result.crossings)  # (a graph a backward of this same step freed is drawn by explain())
        if self.wants_snapshot(record, crosses):
            self.snapshot(record.step, roots, CROSSING if crosses else "first backward")
        return result.freed

    def _reached_params(self, record: BackwardRecord, params: list[Any], accumulate: bool) -> None:
        """Note the parameters the backward reaches (and, for one that accumulates, count it into them)."""
        self._reached[record.id] = frozenset(map(id, params))
        if accumulate:
            self._grads.accumulated(params)

    def _name_carrier(self, record: BackwardRecord) -> None:
        """Name the values that carried the crossings' earlier nodes (the first few distinct ones: two tensors
        kept from step 0, each used by this step, are two carriers to fix), while the loop's frames are here."""
        carriers = dict.fromkeys(child for _, child in record.crossings)
        for carrier_id in list(carriers)[:_CARRIERS_NAMED]:
            carrier = self._recorder.trace.nodes.get(carrier_id)
            if carrier is None or carrier.carried_as is not None:
                continue
            named = name_carrier(self._recorder, sys._getframe(2), carrier)
            if named is not None:
                carrier.carried_as, carrier.carried_at, carrier.carried_fix = named.name, named.frame_site, named.statement
                carrier.carried_kind, carrier.carried_type = named.kind, named.value_type
                carrier.carried_with = list(named.together)

    def explain(
        self, record: BackwardRecord, roots: list[Any], freed: list[NodeRecord] | None, exc: RuntimeError
    ) -> BackwardTwiceError:
        """The error to raise for torch's "backward through the graph a second time" ``exc``."""
        trace = self._recorder.trace
        stale = freed[0] if freed else None  # the light level records no saved tensors: no stale node
        path = path_to(roots, stale) if stale is not None else []
        shared, cause = None, None
        if stale is not None and stale.freed_by is not None:
            freeing = trace.backwards[stale.freed_by]
            shared, _ = handed_off(path, self._started_at[freeing.id])
            losses = [t.grad_fn for ref in self._losses.get(freeing.id, ()) if (t := ref()) is not None]
            try:
                finder = CauseFinder(self._recorder, sys._getframe(2), self._stepped_after)
                cause = finder.cause(freeing, record, roots, shared, [n for n in losses if n is not None],
                                     self._reached.get(freeing.id))
            except Exception as error:  # looking closer must never hide the user's error
                notify(f"graphwatch: could not look into the cause ({error!r})", stacklevel=2)
        finding = explain_backward_twice(trace, record, stale, path, shared, cause)
        self._log.add(finding)
        self._recorder.keep_detail(record.step)
        self.snapshot(record.step, roots, "backward through a freed graph", force=True,
                      focus_on=[stale.id] if stale is not None else [])
        return BackwardTwiceError(f"{exc}\n\n{finding.message}", finding)

    def explain_inplace(self, handle: SavedHandle, tensor: torch.Tensor) -> str:
        """graphwatch's paragraph for a saved tensor changed in place (the line that changed it, and the
        out-of-place form there), and its finding logged."""
        recorder = self._recorder
        backward = recorder.backward
        losses = self._losses.get(backward.id, []) if backward is not None else []
        roots = [t.grad_fn for ref in losses if (t := ref()) is not None]
        cause = InplaceFinder(recorder, [r for r in roots if r is not None], sys._getframe(1)).cause(handle, tensor)
        finding = inplace_finding(recorder.trace, cause, recorder.step)
        if not carried_update(recorder.trace, cause, recorder.step):  # (else the carried graph's finding is the one)
            self._log.add(finding)
            recorder.keep_detail(recorder.step)
        return finding.message

    def explain_no_graph(self, record: BackwardRecord, exc: RuntimeError) -> LossWithoutGraphError:
        """The error to raise for torch's "does not require grad and does not have a grad_fn" ``exc``."""
        cause = find_no_grad(self._recorder, sys._getframe(2), record.site)
        finding = no_graph_finding(self._recorder.trace, cause, record.step)
        self._log.add(finding)
        return LossWithoutGraphError(f"{exc}\n\n{finding.message}", finding)

    def explain_unused_input(
        self, record: BackwardRecord, outputs: Any, args: tuple, kwargs: dict, exc: RuntimeError
    ) -> RuntimeError:
        """The error to raise for torch's "appears to not have been used in the graph" ``exc`` of a
        ``torch.autograd.grad`` (``outputs``, ``args`` and ``kwargs``: the engine call's)."""
        try:
            cause = find_unused_input(self._recorder, sys._getframe(2), record.site, outputs,
                                      engine_inputs(args, kwargs), unused_index(exc))
        except Exception as error:  # looking closer must never hide the user's error
            notify(f"graphwatch: could not look into the cause ({error!r})", stacklevel=2)
            return exc
        finding = unused_input_finding(self._recorder.trace, cause, record.step)
        self._log.add(finding)
        return ExplainedError(f"{exc}\n\n{finding.message}", finding)

    def explain_escaped(self, exc: BaseException | None, tb: TracebackType | None) -> None:
        """torch's error raised by the user's own call, leaving the session (a backward of a tensor of more
        than one element, a leaf changed in place, DDP's reducer errors): its finding logged, and its paragraph
        added after torch's message (the same exception, its traceback kept), from the frames ``tb`` keeps."""
        if not isinstance(exc, RuntimeError) or isinstance(exc, ExplainedError) or "\n\ngraphwatch: " in str(exc):
            return
        recorder = self._recorder
        finding: Finding | None = None
        try:
            if is_non_scalar_error(exc):
                finding = non_scalar_finding(recorder.trace, find_non_scalar(recorder, tb), recorder.step)
            elif is_leaf_inplace_error(exc):
                finding = leaf_inplace_finding(recorder.trace, find_leaf_inplace(recorder, tb), recorder.step)
            elif (ddp := find_ddp_cause(recorder, exc, tb)) is not None:  # DDP's reducer errors
                finding = ddp_finding(recorder.trace, ddp, recorder.step)
        except Exception as error:  # looking closer must never hide the user's error
            notify(f"graphwatch: could not look into the cause ({error!r})", stacklevel=2)
        if finding is not None:
            self._log.add(finding)
            exc.args = (f"{exc}\n\n{finding.message}", *exc.args[1:])

    def settle_retained(self, current: StepRecord) -> None:
        """At a step end: what each retained graph of the step still holds in saved tensors."""
        trace = self._recorder.trace
        saved = trace.saved
        for backward, reached in self.retained:
            held = 0
            for node_id in reached:
                node = trace.nodes.get(node_id)
                if node is not None and node.step == current.index:
                    held += sum(saved[i].nbytes for i in node.saved if i in saved and saved[i].alive)
            backward.held_bytes = held
        self.retained.clear()

    # ------------------------------------------------------------- snapshots
    def wants_snapshot(self, record: BackwardRecord, crosses: bool) -> bool:
        """Auto: the first backward, and the first backward whose graph crosses steps."""
        taken = self._recorder.trace.snapshots
        if self._snapshots == "off" or len(taken) >= self._max_snapshots:
            return False
        if self._snapshots != "auto":
            return record.step in self._snapshots and not any(s.step == record.step for s in taken)
        if not self._first_drawn:
            return self._small_enough(record)
        return crosses and not any(s.reason == CROSSING for s in taken)

    def _small_enough(self, record: BackwardRecord) -> bool:
        """Whether the first backward's step is small enough to draw (:data:`DRAW_SAVED_BOUND`); if not, the
        snapshot is given up and the trace says so in its place."""
        saved = self._recorder.current.saved_packed
        if saved <= DRAW_SAVED_BOUND:
            return True
        self._first_drawn = True
        note = (
            f"not drawn: step {record.step} saved {saved:,} tensors before its first backward, over the bound"
            f" of {DRAW_SAVED_BOUND:,}\\n(a graph that large gets counts, not a record per node)"
        )
        self._recorder.trace.snapshots.append(
            Snapshot(record.step, "first backward", f'digraph {{ note [shape=note, label="{note}"] }}')
        )
        return False

    def snapshot(
        self, step: int, roots: Iterable[Any], reason: str, force: bool = False,
        outputs: Mapping[str, torch.Tensor] | None = None, focus_on: Collection[int] = (),
        notes: Mapping[str, str] | None = None,
    ) -> None:
        """Draw the graph below ``roots`` (and below ``outputs``, drawn by name with ``notes`` under them: what
        holds a kept graph) into the trace (at most ``max_snapshots``, unless ``force``): whole, and focused on where steps cross
        and on the NodeRecord ids ``focus_on``."""
        trace = self._recorder.trace
        self._first_drawn = True
        if self._snapshots == "off" or (len(trace.snapshots) >= self._max_snapshots and not force):
            return
        from .rendering.dot import snapshot_dots  # here: a run that draws no graph never loads the drawing code

        hide_from_compiler()  # (the drawing code just loaded, maybe inside a compiled function)
        retained = {i for _, reached in self.retained for i in reached}
        try:
            params = _parameter_names(sys._getframe())
            roots = list(roots)
            dot, focus = snapshot_dots(roots, trace, step, retained=retained, params=params, outputs=outputs,
                                       focus_on=focus_on, notes=notes)
        except Exception as exc:  # a drawing must never break the user's backward
            notify(f"graphwatch: could not draw the step {step} graph ({exc!r}); the trace is unaffected", stacklevel=2)
            return
        trace.snapshots.append(Snapshot(step, reason, dot, focus))


def _parameter_names(frame: Any, limit: int = 8) -> dict[str, torch.Tensor]:
    """``{"model.0.weight": tensor, ...}``: parameters named as the user's frames hold their modules, also
    through ``self`` (a trainer's ``self.model``: ``self.model.0.weight``), and leaf tensors that require grad
    by the variable holding them (``w``), in the innermost ``limit`` user frames.

    >>> class Trainer:
    ...     def __init__(self):
    ...         self.model = torch.nn.Linear(2, 1)
    ...     def names(self):
    ...         w = torch.ones(2, requires_grad=True)
    ...         return sorted(_parameter_names(sys._getframe()))
    >>> Trainer().names()
    ['self.model.bias', 'self.model.weight', 'w']
    """
    names = parameter_names(frame, limit)
    seen = {id(param) for param in names.values()}

    def add(name: str, tensor: torch.Tensor) -> None:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            names[name] = tensor

    frames = list(user_frames(frame))[:limit]
    for user_frame in frames:
        owner = local_value(user_frame, "self")
        if owner is not None and not issubclass(type(owner), torch.nn.Module):
            for attr, module in attribute_items(owner, None):  # (a module as ``self`` is a frame's module already)
                if issubclass(type(module), torch.nn.Module) and not attr.startswith("_"):
                    for name, param in module.named_parameters(prefix=f"self.{attr}"):
                        add(name, param)
    for user_frame in frames:
        for name, value in _variables(user_frame):
            if issubclass(type(value), torch.Tensor) and value.is_leaf and value.requires_grad and not name.startswith("_"):
                add(name, value)
    return names


def _variables(frame: Any) -> list[tuple[str, Any]]:
    """A frame's variables: a function's locals one by one (no snapshot of them kept on the frame), or the
    namespace of a module's code."""
    code = frame.f_code
    if code.co_flags & inspect.CO_OPTIMIZED:
        return [(name, local_value(frame, name)) for name in (*code.co_varnames, *code.co_cellvars)]
    return list(frame.f_globals.items())
