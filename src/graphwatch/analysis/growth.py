"""Steady growth of live graph memory over steps: a least-squares line through the steps.

One ``memory-growth`` finding per session covers both series graphwatch
keeps per step (live saved-tensor bytes, autograd nodes alive), with the
fitted slope, the projection at ten times the steps, and the findings that
explain it.

At the default level a step seen light walks no graph and counts no saved tensor: its record repeats the last
measured counts (shown as "–", :func:`live_counts_measured`), and the fit runs over every step's record.

Example::

    >>> from graphwatch.analysis.growth import fit_line
    >>> slope, intercept, r2 = fit_line([0, 1, 2, 3], [10, 20, 30, 40])
    >>> round(slope), round(intercept), round(r2, 3)
    (10, 10, 1.0)
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import TypeVar

from ..model import Finding, Remedy, Trace
from ..model.columns import field_values
from .evidence import human_bytes
from .findings import make_finding, renderer
from .retained import final_retained
from .untrained import untrained_parameters

MIN_STEPS = 5  # fewer steps than this say nothing about a trend
MIN_R2 = 0.8  # how straight the rise must be
MIN_RISE = 2.0  # the last value at least this many times the first (plus the minimum below)
MIN_BYTES = 16 * 1024
MIN_NODES = 8
EXPLAINS = ("graph-carried-across-steps", "retained-graph", "graph-kept-alive")


Value = TypeVar("Value")


def live_counts_measured(trace: Trace) -> Callable[[int], bool]:
    """Whether the live counts of step ``index`` (saved bytes and nodes alive at its end) and its backwards' CPU
    time were measured: every step's at ``level="full"`` and ``"precise"`` (and in a trace that names no level),
    none at ``"light"``, and at the default level those of the steps seen in full detail (``trace.full_detail``).

    >>> from graphwatch.model import DetailSpan
    >>> measured = live_counts_measured(Trace(options={"level": "default"}, full_detail=[DetailSpan(0, 3, "first steps")]))
    >>> [measured(i) for i in (0, 2, 3)]
    [True, True, False]
    """
    level = trace.options.get("level")
    if level == "light":
        return lambda index: False
    if level != "default":
        return lambda index: True
    spans = trace.full_detail  # (noted in the order of their steps)
    firsts = [span.first for span in spans]

    def measured(index: int) -> bool:
        i = bisect_right(firsts, index) - 1
        return i >= 0 and index < spans[i].end

    return measured


def measured_values(trace: Trace, values: Sequence[Value]) -> list[Value | None]:
    """Each step's live count in ``values`` (one per step of ``trace``), None where it was not measured.

    >>> from graphwatch.model import DetailSpan, StepRecord
    >>> steps = [StepRecord(index=i, source="optimizer") for i in range(4)]
    >>> measured_values(Trace(options={"level": "default"}, steps=steps, full_detail=[DetailSpan(1, 2, "sampled")]), [5, 6, 7, 8])
    [None, 6, None, None]
    """
    measured = live_counts_measured(trace)
    return [value if measured(index) else None for index, value in zip(field_values(trace.steps, "index"), values)]


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """(slope, intercept, r squared) of the least-squares line through the points."""
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))
    syy = sum((y - mean_y) ** 2 for y in ys)
    slope = sxy / sxx if sxx else 0.0
    intercept = mean_y - slope * mean_x
    r2 = (sxy * sxy) / (sxx * syy) if sxx and syy else 0.0
    return slope, intercept, r2


def growth(xs: list[float], ys: list[float], minimum: float) -> tuple[float, float, float] | None:
    """(slope, value projected at 10x the steps, r²) when ``ys`` rises steadily, else None."""
    if len(xs) < MIN_STEPS:
        return None
    slope, intercept, r2 = fit_line(xs, ys)
    if slope <= 0 or r2 < MIN_R2 or ys[-1] < MIN_RISE * ys[0] + minimum:
        return None
    return slope, intercept + slope * 10 * (xs[-1] + 1), r2


def memory_growth(trace: Trace, explained_by: list[Finding]) -> list[Finding]:
    """Live saved bytes or live nodes that rise steadily step after step (one finding for both)."""
    # read field by field: a long run's settled steps are columns, not records
    rows = list(zip(*(field_values(trace.steps, name) for name in ("index", "live_activation_bytes", "live_nodes"))))
    kept = [row for row, source in zip(rows, field_values(trace.steps, "source")) if source != "session-end"]
    rows = kept or rows
    xs = [float(row[0]) for row in rows]
    saved = [float(row[1]) for row in rows]
    nodes = [float(row[2]) for row in rows]
    if trace.options.get("level") == "default":
        saved, nodes = _alive_since(trace, xs, saved, "saved_alive_by_step"), _alive_since(trace, xs, nodes, "nodes_alive_by_step")
    by_bytes, by_nodes = growth(xs, saved, MIN_BYTES), growth(xs, nodes, MIN_NODES)
    fit = by_bytes or by_nodes
    if fit is None:
        return []
    causes = [f for f in explained_by if f.kind in EXPLAINS]
    evidence = {
        "key": "memory-growth",
        "sites": list(dict.fromkeys(site for f in causes for site in f.evidence.get("sites", [])[:1])),
        "steps": [rows[0][0], rows[-1][0]],
        "fitted_steps": len(rows),
        "unit": "bytes" if by_bytes else "nodes",
        "per_step_slope": fit[0],
        "projected": fit[1],
        "r2": fit[2],
        "bytes": int(saved[-1]),
        "bytes_first": int(saved[0]),
        "bytes_per_step": by_bytes[0] if by_bytes else None,
        "projected_bytes": by_bytes[1] if by_bytes else None,
        "nodes": int(nodes[-1]),
        "nodes_first": int(nodes[0]),
        "nodes_per_step": by_nodes[0] if by_nodes else None,
        "projected_nodes": by_nodes[1] if by_nodes else None,
        "explained_by": list(
            dict.fromkeys(f"{f.kind} at {f.evidence['sites'][0]}" if f.evidence["sites"] else f.kind for f in causes)
        ),
    }
    return [make_finding("memory-growth", "warning", rows[-1][0], evidence, [_growth_advice(evidence)])]


def _alive_since(trace: Trace, xs: list[float], values: list[float], table: str) -> list[float]:
    """The live counts ``values`` of the steps ``xs`` (a ``table`` of the step records: ``nodes_alive_by_step`` or
    ``saved_alive_by_step``), each step seen light raised to what the last step measured with its table (a step
    seen in full detail) still holds of that step and the ones before it: a graph made in step ``s`` and alive
    then was alive at every step from ``s`` on.  A light step's record repeats the last measured count; a graph
    kept from a light step on (a leak that starts late) counts from the step that made it, as ``level="full"``
    counts it.  A lower bound: what died before that step is not counted.

    >>> from graphwatch.model import DetailSpan, StepRecord
    >>> steps = [StepRecord(index=i, source="optimizer", live_nodes=4) for i in range(5)]
    >>> steps[4].nodes_alive_by_step = {2: 3, 3: 3, 4: 3}
    >>> spans = [DetailSpan(0, 2, "first steps"), DetailSpan(4, 5, "held")]
    >>> trace = Trace(options={"level": "default"}, steps=steps, full_detail=spans)
    >>> _alive_since(trace, [0.0, 1.0, 2.0, 3.0, 4.0], [4.0, 4.0, 4.0, 4.0, 9.0], "nodes_alive_by_step")
    [4.0, 4.0, 4.0, 6.0, 9.0]
    """
    measured = live_counts_measured(trace)
    last = next((i for i in range(len(xs) - 1, -1, -1) if measured(int(xs[i]))), None)
    alive = getattr(trace.steps[int(xs[last])], table) if last is not None else {}
    if not alive:
        return values
    made = sorted(alive.items())
    steps, totals = [step for step, _ in made], list(accumulate(count for _, count in made))
    filled = list(values)
    for i in range(last or 0):
        index = int(xs[i])
        if not measured(index):
            below = bisect_right(steps, index)  # (graphs of the steps up to this one, alive at the last measured)
            filled[i] = max(values[i], float(totals[below - 1]) if below else 0.0)
    return filled


def _growth_advice(ev: dict) -> Remedy:
    """Advice, never an edit: the findings that explain the growth carry the edits."""
    if ev["explained_by"]:
        return Remedy("fix the findings that keep graphs alive: " + "; ".join(ev["explained_by"]))
    return Remedy(
        "find what keeps each step's graph: detach tensors kept across steps, keep `loss.item()`, evaluate under "
        "`torch.no_grad()`"
    )


@renderer("memory-growth")
def _render_growth(ev: dict) -> str:
    first, last = ev["steps"]
    horizon = 10 * (last + 1)
    parts = []
    if ev["bytes_per_step"] is not None:
        parts.append(
            f"live saved-tensor memory grows by {human_bytes(ev['bytes_per_step'])} per step, from "
            f"{human_bytes(ev['bytes_first'])} to {human_bytes(ev['bytes'])}: about "
            f"{human_bytes(ev['projected_bytes'])} by step {horizon}"
        )
    if ev["nodes_per_step"] is not None:
        parts.append(
            f"autograd nodes alive grow by {ev['nodes_per_step']:.1f} per step, from {ev['nodes_first']:,} to "
            f"{ev['nodes']:,}: about {ev['projected_nodes']:,.0f} by step {horizon}"
        )
    cause = f"; explained by {', '.join(ev['explained_by'])}" if ev["explained_by"] else ""
    return (
        f"{' and '.join(parts)} (a straight-line fit over the {ev['fitted_steps']} steps {first}..{last}, "
        f"r²={ev['r2']:.2f}; the projection is for a run ten times as long){cause}"
    )


def session_findings(trace: Trace) -> list[Finding]:
    """Findings that need the whole run: the last step's unused retains, then memory growth, attributed, then
    parameters an optimizer stepped and never trained."""
    found = final_retained(trace)
    return found + memory_growth(trace, trace.findings + found) + untrained_parameters(trace)
