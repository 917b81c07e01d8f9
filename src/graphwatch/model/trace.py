"""The trace: everything a session recorded; its steps and backwards are
:class:`~graphwatch.model.columns.RecordList` objects (settled records kept in columns).

Example::

    >>> from graphwatch.model import StepRecord, Trace
    >>> trace = Trace(steps=[StepRecord(index=0, source="optimizer")])
    >>> type(trace.steps).__name__, len(trace.steps), averaged_steps(trace)
    ('RecordList', 1, (0, 0))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .columns import TRACE_COLUMNS, RecordList
from .records import BackwardRecord, CallSite, DetailSpan, Finding, NodeRecord, SavedRecord, Snapshot, StepRecord
from .source_lines import SourceLines
from .training import OptimizerRecord, ParameterRecord


@dataclass(slots=True)
class Trace:
    """Everything a session recorded.  ``graphwatch.load`` returns one of these."""

    torch_version: str = ""
    python_version: str = ""
    started_at: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    sites: list[CallSite] = field(default_factory=list)
    nodes: dict[int, NodeRecord] = field(default_factory=dict)
    saved: dict[int, SavedRecord] = field(default_factory=dict)
    # RecordLists (list-like; settled records are kept in columns, see graphwatch.model.columns)
    backwards: list[BackwardRecord] = field(default_factory=lambda: _record_list("backwards"))
    steps: list[StepRecord] = field(default_factory=lambda: _record_list("steps"))
    findings: list[Finding] = field(default_factory=list)
    snapshots: list[Snapshot] = field(default_factory=list)
    sources: list[SourceLines] = field(default_factory=list)  # the lines findings cite, read when recorded
    full_detail: list[DetailSpan] = field(default_factory=list)  # the steps seen in full detail, and why
    untracked_saved: int = 0  # tensors saved under user hooks we could not see
    ended_early: str | None = None  # why the run stopped before the session ended
    averaged_from: int = 0  # first step whose times and sizes read as span means (long runs: model.packed)
    averaged_before: int = 0  # the step after the last such one (0: no step was averaged)
    rank: int | None = None
    world_size: int | None = None
    # The session's own span (0.0: not recorded, e.g. a trace of an older graphwatch): wall clock, CPU time of
    # the process, and graphwatch's own CPU time by part (see graphwatch.capture.hooks.own_time)
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    own_seconds: dict[str, float] = field(default_factory=dict)
    # what trained (``graphwatch run``): each optimizer, and per parameter it owns whether it got a gradient
    optimizers: list[OptimizerRecord] = field(default_factory=list)
    parameters: list[ParameterRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("backwards", "steps"):
            value = getattr(self, name)
            if isinstance(value, list):
                setattr(self, name, _record_list(name, value))

    def site(self, site_id: int | None) -> CallSite | None:
        """The CallSite with that id, or None."""
        return None if site_id is None else self.sites[site_id]

    def where(self, site_id: int | None) -> str:
        """``file:line`` of a site id, or ``"<unknown>"``."""
        site = self.site(site_id)
        return site.where if site else "<unknown>"


def _record_list(name: str, records: list[Any] | None = None) -> Any:
    return RecordList(TRACE_COLUMNS[name], records or ())


def averaged_steps(trace: Trace) -> tuple[int, int]:
    """(first, stop): the steps whose times and sizes, or those of their backwards, read as the mean of
    their span; (0, 0) when every step's read as recorded.

    Only a run longer than :data:`AVERAGE_AFTER` steps (or backwards) has averaged ones; steps that carry
    detail (a finding's evidence) are never averaged.
    """
    spans = []
    if isinstance(trace.steps, RecordList) and (span := trace.steps.averaged())[1]:
        spans.append(span)
    if isinstance(trace.backwards, RecordList) and (span := trace.backwards.averaged())[1]:
        spans.append((trace.backwards[span[0]].step, trace.backwards[span[1] - 1].step + 1))
    return (min(a for a, _ in spans), max(b for _, b in spans)) if spans else (0, 0)
