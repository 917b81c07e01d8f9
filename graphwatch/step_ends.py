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

from types import FrameType
from typing import Any

from .analysis import LEAK_KINDS, FindingLog, graph_kept_alive, step_findings
from .analysis.evidence import counted, human_bytes, steps_text
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
        new = [f for f in step_findings(trace, record, refresh) if self._log.add(f)]
        if new:
            recorder.keep_detail(record.index)
        for finding in new:
            if finding.kind == "graph-kept-alive" and frame is not None:
                self._draw_kept(record.index, finding, frame)
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

    def _draw_kept(self, step: int, finding: Finding, frame: Any) -> None:
        """A picture of what a kept-alive finding's holder keeps: the holder by name, the graphs below it."""
        holder = finding.evidence.get("holder")
        if not isinstance(holder, str):
            return
        base = holder.split("[")[0]
        held = {name: t for name, t in tensors_in_user_frames(frame) if name.split("[")[0] == base}
        if held:
            ev = finding.evidence
            nodes, kept_bytes = int(ev.get("nodes") or 0), int(ev.get("bytes") or 0)
            size = [counted(nodes, "autograd node")] * bool(nodes) + [f"{human_bytes(kept_bytes)} saved"] * bool(kept_bytes)
            reason = f"kept alive by `{holder}`: the graphs of {steps_text(ev.get('kept_steps') or [])}"
            reason += f" ({', '.join(size)})" if size else ""
            self._backwards.snapshot(step, [], reason, outputs=dict(list(held.items())[-8:]))
