"""Steady growth of live graph memory over steps: a least-squares line through the steps.

Example::

    >>> from graphwatch.analysis.growth import fit_line
    >>> slope, intercept, r2 = fit_line([0, 1, 2, 3], [10, 20, 30, 40])
    >>> round(slope), round(intercept), round(r2, 3)
    (10, 10, 1.0)
"""

from __future__ import annotations

from ..model import Finding, Trace
from .evidence import human_bytes

MIN_STEPS = 5  # fewer steps than this say nothing about a trend
MIN_R2 = 0.8  # how straight the rise must be
MIN_RISE = 2.0  # the last value at least this many times the first (plus MIN_BYTES)
MIN_BYTES = 16 * 1024


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


def _growth(xs: list[float], ys: list[float], minimum: float) -> tuple[float, float, float] | None:
    if len(xs) < MIN_STEPS:
        return None
    slope, intercept, r2 = fit_line(xs, ys)
    if slope <= 0 or r2 < MIN_R2 or ys[-1] < MIN_RISE * ys[0] + minimum:
        return None
    return slope, intercept, r2


def memory_growth(trace: Trace, explained_by: list[str]) -> list[Finding]:
    """Live saved bytes or live nodes that rise steadily step after step."""
    steps = [s for s in trace.steps if s.source != "session-end"] or trace.steps
    xs = [float(s.index) for s in steps]
    findings = []
    for label, values, minimum, fmt in (
        ("live saved-tensor memory", [float(s.live_activation_bytes) for s in steps], MIN_BYTES, human_bytes),
        ("autograd nodes alive", [float(s.live_nodes) for s in steps], 8, lambda v: f"{v:,.0f} nodes"),
    ):
        fitted = _growth(xs, values, minimum)
        if fitted is None:
            continue
        slope, intercept, r2 = fitted
        horizon = 10 * (xs[-1] + 1)
        cause = f"; explained by: {', '.join(explained_by)}" if explained_by else ""
        findings.append(
            Finding(
                "memory-growth",
                "warning",
                steps[-1].index,
                f"{label} grows by {fmt(slope)} per step (fit over {len(xs)} steps, r²={r2:.2f}): from "
                f"{fmt(values[0])} to {fmt(values[-1])}, about {fmt(intercept + slope * horizon)} at step "
                f"{horizon:.0f} if the run goes on ten times as long{cause}",
                "fix the findings above that keep graphs alive"
                if explained_by
                else "find what keeps each step's graph: detach tensors kept across steps, keep `loss.item()`",
                {
                    "key": label,
                    "steps": [steps[0].index, steps[-1].index],
                    "per_step_slope": slope,
                    "r2": r2,
                    "projected": intercept + slope * horizon,
                    "bytes": int(values[-1]) if "memory" in label else None,
                    "explained_by": explained_by,
                },
            )
        )
    return findings


def session_findings(trace: Trace) -> list[Finding]:
    """Findings that need the whole run: memory growth, attributed to the leaks already found."""
    explained = sorted({f.kind for f in trace.findings if f.kind not in ("memory-growth", "missing-zero-grad")})
    return memory_growth(trace, explained)
