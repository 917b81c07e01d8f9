"""What a session does at the end of each step: search the holders of earlier steps' graphs, close the
step's record, run the step's detectors, draw what a kept-alive finding keeps, and in strict mode stop
at the first leak.  At the default level a step seen light (:mod:`graphwatch.capture.steps.detail`) only closes
its record, unless what it made or the memory it leaves asks for a closer look; a step seen in full detail
tells the plan what asks for the next steps to be seen so too.

Example::

    >>> import torch, graphwatch
    >>> with graphwatch.watch(summary=False) as gw:
    ...     total = 0
    ...     for _ in range(4):
    ...         loss = torch.ones(2, requires_grad=True).mul(2).sum()
    ...         loss.backward()
    ...         total += loss  # keeps each step's graph
    ...         gw.end_step()
    >>> [h.name for h in gw.trace.steps[3].holders]
    ['total']
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import FrameType
from typing import Any

from .analysis import LEAK_KINDS, FindingLog, graph_kept_alive, step_findings
from .analysis.evidence import spans_text
from .analysis.leaks import kept_moment, kept_size
from .backwards import BackwardWatch
from .capture import Recorder
from .capture.causes.holders import HolderSearch, tensors_in_user_frames
from .capture.steps.detail import DetailPlan
from .capture.steps.light_signals import LightSignals
from .errors import GraphLeakError
from .model import Finding, StepRecord


class StepEnds:
    """Ends a session's steps (see the module's docstring); ``light``: a step seen light, which walked no
    graph and saved no tensor, so that its end only closes the record (and watches for signals)."""

    def __init__(
        self, recorder: Recorder, log: FindingLog, backwards: BackwardWatch, strict: bool, plan: DetailPlan,
        signals: LightSignals,
    ) -> None:  # fmt: skip
        self._recorder = recorder
        self._log = log
        self._backwards = backwards
        self._strict = strict
        self._holders = HolderSearch()
        self._plan = plan
        self._signals = signals
        self._alive_before: set[int] = set()  # earlier steps with graphs alive at the last full step's end
        self._last_look: StepRecord | None = None  # the last step end that searched for holders, as it was then

    def end(
        self, source: str, frame: FrameType | None, light: bool, final: bool = False, script: dict | None = None
    ) -> StepRecord:
        """End the current step; its holders are searched from ``frame`` outwards (and in a finished
        script's globals, ``script``, at the ``final`` step)."""
        __tracebackhide__ = True  # pytest: a strict-mode GraphLeakError points at the user's line
        recorder = self._recorder
        current, step, plan = recorder.current, recorder.step, self._plan
        adaptive = not (plan.always or plan.never)
        if self._backwards.retained:
            self._backwards.settle_retained(current)
        if light:  # a census only where the step made what no step before, or something holds an old graph
            census = adaptive and (final or self._made_signal(step, recorder.nodes_made()) or self._held_signal(frame, step))
        else:  # steps 0, 1, 2, 4, 8, ... (HolderSearch), and the first after steps seen light
            census = final or step & (step - 1) == 0 or (adaptive and not plan.is_full(step - 1))
            self._signals.step_made(step, recorder.nodes_made(), learn=True)  # (no signal on a full step)
        looks = (frame is not None or final) and (census or not light)
        if looks:
            current.holders = self._holders.at_step_end(recorder, frame, census, script if final else None)
        before = self._last_look  # (what growth is judged against: the step before, unless it was seen light)
        record = recorder.end_step(source, full=not light)
        if looks:
            self._last_look = replace(record)  # (a copy: the record loses its holders when it leaves the window)
        if light:
            reason = self._signals.resident(record.rss_bytes) if adaptive else None
            if reason is not None:
                plan.suspect(record.index, reason)
            if not census:  # no walks and no saved tensors: nothing a step detector starts from
                return record
        else:
            self._signals.full_step_ended(record.rss_bytes)
        trace = recorder.trace
        refresh = final or record.index & (record.index - 1) == 0  # steps 0, 1, 2, 4, 8, ... and the last
        found = step_findings(trace, record, refresh, before=before)
        new = [f for f in found if self._log.add(f)]
        if new:
            recorder.keep_detail(record.index)
            self._signals.found_something()
        if adaptive and not light:
            self._full_step_signals(record, new)
        for finding in found:  # new, or refreshed with this step's figures
            if finding.kind == "graph-kept-alive" and frame is not None:
                self._draw_kept(record, self._log.logged(finding), frame)
        if self._strict:
            leaks = [f for f in new if f.kind in LEAK_KINDS]
            if leaks:
                raise GraphLeakError(
                    f"graphwatch strict mode: step {record.index} leaks a graph:\n" + "\n".join(map(str, leaks)),
                    leaks,
                )
        return record

    def _made_signal(self, step: int, nodes: int) -> bool:
        """A light step made more or fewer nodes than any step before it: look at it, and at the next steps."""
        reason = self._signals.step_made(step, nodes)
        if reason is not None:
            self._plan.suspect(step, reason)
        return reason is not None

    def _held_signal(self, frame: FrameType | None, step: int) -> bool:
        """The user's frames hold a graph older than the last step (at the first light steps): look at it, and on."""
        if frame is None or step < 1 or not self._signals.looks_at_held():
            return False
        recorder = self._recorder
        reported = {h for f in recorder.trace.findings if f.kind == "graph-kept-alive" and (h := f.evidence.get("holder"))}
        reason = self._signals.held_graph(frame, recorder.clock.bounds[step - 1], recorder.clock.step_of, reported)
        if reason is not None:
            self._plan.suspect(step, reason)
        return reason is not None

    def _full_step_signals(self, record: StepRecord, new: list[Finding]) -> None:
        """What a step seen in full detail shows that asks for the next steps to be seen so too: a new finding,
        more graphs of earlier steps alive than at the last full step's end (also once a leak is reported: while
        the kept graphs grow, every step is seen in full detail, so that its live counts are measured and
        ``memory-growth`` is found as ``level="full"`` finds it; a bounded keep stops asking), a graph carried in
        from a step seen light (while no carried graph is reported)."""
        trace, plan, index = self._recorder.trace, self._plan, record.index
        backwards = [trace.backwards[i] for i in record.backwards]
        alive = {
            s for table in (record.nodes_alive_by_step, record.saved_alive_by_step) for s in table
            if 0 <= s < index
        }  # fmt: skip
        reason = None
        if new:
            reason = f"{new[0].kind} found in step {index}"
        elif len(alive) > len(self._alive_before):
            reason = f"more graphs of earlier steps alive at the end of step {index}"
        elif any(not plan.is_full(s) for bw in backwards for s in bw.earlier_steps if s >= 0) and not any(
            f.kind == "graph-carried-across-steps" for f in trace.findings
        ):
            reason = f"a graph carried into step {index} from a step seen light"
        self._alive_before = alive
        if reason is not None:
            plan.suspect(index, reason)

    def finish(self, frame: FrameType | None, light: bool, script: dict | None, cut_short: bool = False) -> None:
        """End the last step; its holders are searched in ``frame`` (the ``with`` block's) and ``script``
        (``cut_short``: an exception ends the session, maybe inside a step seen light, which saved nothing
        graphwatch saw: it is closed if it made nodes).  Forwards alone after the last step are no step of their
        own (:meth:`_last_part_is_a_step`)."""
        recorder = self._recorder
        trace = recorder.trace
        if recorder.boundary_pending:
            self.end(recorder.pending_source, frame, light, final=True, script=script)
        elif self._last_part_is_a_step(light, cut_short):
            self.end("session-end", frame, light, final=True, script=script)
        elif self._plan.is_full(len(trace.steps) - 1) and recorder.made_nothing_yet():
            if trace.steps[-1].detail:  # the last step: every holder's full count
                self._refresh_kept(trace.steps[-1], frame)
        elif not self._plan.never and (frame is not None or script is not None):  # seen light, or forwards since: a census
            last = trace.steps[-1]  # (as at its end: its own graphs are not earlier ones, and are counted now)
            holders = self._holders.at_step_end(recorder, frame, True, script, step=last.index)
            # graphs of earlier steps outlive the loop and forwards since saved tensors (not a `total = total + loss`
            # after the loop's last optimizer step): those forwards are the step that shows them kept
            if holders and (recorder.current.saved_packed or recorder.saves_seen(recorder.step)):
                self.end("session-end", frame, light, final=True, script=script)
                return
            last.holders = holders
            recorder.recount_ended(last)
            if last.holders:  # (the loop's frames may be gone: no finding of what nothing names)
                self._refresh_kept(last, frame)

    def _last_part_is_a_step(self, light: bool, cut_short: bool) -> bool:
        """Whether what ran after the last step's end is a step of its own: the first one, one that ran a
        backward, one a finding was made in, or one an exception cut short that made a graph.  Forwards alone
        after the last step (a final ``predict()``, a last evaluation) are not, unless graphs of earlier steps
        are still held when the session ends (:meth:`finish`): they are then the step those are seen kept at
        the end of, as before, so that no kept-alive finding is lost."""
        recorder = self._recorder
        current, trace, index = recorder.current, recorder.trace, recorder.step
        if current.backwards or not trace.steps or any(f.step == index for f in trace.findings):
            return True
        made = current.saved_packed or recorder.saves_seen(index) or (light and recorder.nodes_made())
        return cut_short and bool(made)

    def _refresh_kept(self, step: StepRecord, frame: FrameType | None) -> None:
        """The kept-alive findings at the end of the session, with the last step's holders."""
        before = self._last_look if self._last_look is not None and self._last_look.index < step.index else None
        for finding in graph_kept_alive(self._recorder.trace, step, before=before):
            if self._log.add(finding):
                self._recorder.keep_detail(step.index)
            if frame is not None:
                self._draw_kept(step, self._log.logged(finding), frame)

    def _draw_kept(self, step: StepRecord, finding: Finding, frame: Any) -> None:
        """A picture of what a kept-alive finding's holder keeps at the end of ``step`` (the holder by name,
        the graphs below it), captioned and noted with the finding's own figures of that moment.  A finding
        refreshed later is drawn again, replacing its picture, while its graphs are small enough
        (:data:`REDRAW_NODES`) and the holder can still be reached; otherwise its last picture stays, its
        caption naming its own step end.  The evidence's ``pictured`` is the moment the picture shows."""
        holder, kept = finding.evidence.get("holder"), finding.evidence["kept"]
        if not isinstance(holder, str) or kept["step"] != step.index:
            return
        snapshots = self._recorder.trace.snapshots
        drawn = [i for i, snapshot in enumerate(snapshots) if snapshot.reason.startswith(f"kept alive by `{holder}` ")]
        if drawn and kept["nodes"] > REDRAW_NODES:
            return
        base = holder.split("[")[0]
        held = {name: t for name, t in tensors_in_user_frames(frame) if name.split("[")[0] == base}
        if not held:
            return
        outputs = dict(list(held.items())[-8:])
        kept_by = _kept_by(step, finding, outputs)
        notes = {name: _note(kept_moment(step, kept_by[name])) if name in kept_by else "this step's graph: not counted"
                 for name in outputs}  # (an output that holds no earlier step's graph: only this step's)
        reason = f"kept alive by `{holder}` at the end of step {kept['step']}: the graphs of {spans_text(kept['spans'])}"
        reason += f" ({kept_size(kept)})" if kept_size(kept) else ""
        before = len(snapshots)
        self._backwards.snapshot(step.index, [], reason, outputs=outputs, notes=notes, force=bool(drawn))
        if len(snapshots) > before:
            finding.evidence["pictured"] = kept  # the moment the picture shows (the message's, or an earlier one)
            if drawn:  # the new picture replaces the one of an earlier step end
                del snapshots[drawn[0]]


# A kept-alive finding refreshed at a later step end is drawn again while its graphs have at most this many
# nodes (the drawing walks all of them); the picture of a larger one stays as it was, saying its step.
REDRAW_NODES = 2_000


def _kept_by(step: StepRecord, finding: Finding, outputs: Mapping[str, Any]) -> dict[str, list[int]]:
    """The steps each drawn output keeps, of those ``finding`` says are kept: the whole finding's for the holder
    itself (``total_loss``), its own holder record's for an item of a list or dict (``losses[3]``)."""
    kept = [s for first, last in finding.evidence["kept"]["spans"] for s in range(first, last + 1)]
    if finding.evidence.get("holder") in outputs:
        return {finding.evidence["holder"]: kept}
    wanted = set(kept)
    return {h.name: [s for s in h.steps if s in wanted] for h in step.holders if h.name in outputs}


def _note(moment: dict) -> str:
    """What a drawn output keeps, in the words and figures of its finding's message: 'keeps steps 5..8: 28 nodes'."""
    size = kept_size(moment, short=True)
    return f"keeps {spans_text(moment['spans'])}" + (f": {size}" if size else "") if moment["spans"] else ""
