"""What a session does at the end of each step: search the holders of earlier steps' graphs, close the
step's record, run the step's detectors, draw what a kept-alive finding keeps, and in strict mode stop
at the first leak.

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
from types import FrameType
from typing import Any

from .analysis import LEAK_KINDS, FindingLog, graph_kept_alive, step_findings
from .analysis.evidence import spans_text
from .analysis.leaks import kept_moment, kept_size
from .backwards import BackwardWatch
from .capture import Recorder
from .capture.holders import HolderSearch, tensors_in_user_frames
from .errors import GraphLeakError
from .model import Finding, StepRecord


class StepEnds:
    """Ends a session's steps (see the module's docstring); ``light``: the light level, which walks no
    graph and saves no tensor, so that a step end only closes the record."""

    def __init__(self, recorder: Recorder, log: FindingLog, backwards: BackwardWatch, strict: bool) -> None:
        self._recorder = recorder
        self._log = log
        self._backwards = backwards
        self._strict = strict
        self._holders = HolderSearch()

    def end(
        self, source: str, frame: FrameType | None, light: bool, final: bool = False, script: dict | None = None
    ) -> StepRecord:
        """End the current step; its holders are searched from ``frame`` outwards (and in a finished
        script's globals, ``script``, at the ``final`` step)."""
        __tracebackhide__ = True  # pytest: a strict-mode GraphLeakError points at the user's line
        recorder = self._recorder
        current = recorder.current
        if self._backwards.retained:
            self._backwards.settle_retained(current)
        if (frame is not None or final) and not light:
            census = final or recorder.step & (recorder.step - 1) == 0  # steps 0, 1, 2, 4, 8, ...: HolderSearch
            current.holders = self._holders.at_step_end(recorder, frame, census, script if final else None)
        record = recorder.end_step(source)
        if light:  # no walks and no saved tensors: nothing a step detector starts from
            return record
        trace = recorder.trace
        refresh = final or record.index & (record.index - 1) == 0  # steps 0, 1, 2, 4, 8, ... and the last
        found = step_findings(trace, record, refresh)
        new = [f for f in found if self._log.add(f)]
        if new:
            recorder.keep_detail(record.index)
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

    def finish(self, frame: FrameType | None, light: bool, script: dict | None) -> None:
        """End the last step; its holders are searched in ``frame`` (the ``with`` block's) and ``script``."""
        recorder = self._recorder
        current, trace = recorder.current, recorder.trace
        if recorder.boundary_pending:
            self.end(recorder.pending_source, frame, light, final=True, script=script)
        elif current.saved_packed or current.backwards or not trace.steps:
            self.end("session-end", frame, light, final=True, script=script)
        elif not light and trace.steps[-1].detail:  # the last step: every holder's full count
            for finding in graph_kept_alive(trace, trace.steps[-1]):
                self._log.add(finding)
                if frame is not None:
                    self._draw_kept(trace.steps[-1], self._log.logged(finding), frame)

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
