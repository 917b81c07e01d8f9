"""The targets of issue 5, checked against the measured figures (the first table of RESULTS.md)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from deep_graph import scaling, walks_without_snapshot, worst_end_step
from longrun import LongRun
from measure import WorkloadResult, med


@dataclass
class Target:
    name: str
    goal: str
    measured: str
    met: bool | None  # None: not measured

    def row(self) -> str:
        status = "not measured" if self.met is None else ("**met**" if self.met else "**MISSED**")
        return f"| {self.name} | {self.goal} | {self.measured} | {status} |"


def _value(name: str, goal: str, value: float, ok: Callable[[float], bool], unit: str = "x") -> Target:
    """A target on one number (nan: not measured)."""
    if math.isnan(value):
        return Target(name, goal, "-", None)
    measured = f"{value:.2f}x" if unit == "x" else f"{value:.2f} {unit}"
    return Target(name, goal, measured, ok(value))


def targets(results: dict[str, WorkloadResult], long: LongRun | None, headroom: int) -> list[Target]:
    def ratio(w: str, c: str, base: str = "bare") -> float:
        r = results.get(w)
        return r.ratio(c, base) if r and c in r.results and base in r.results else float("nan")

    out = [
        _value("MLP, graphwatch default / bare", "<= 1.30x", ratio("mlp", "gw"), lambda v: v <= 1.30),
        _value("CNN, graphwatch default / bare", "<= 1.05x", ratio("cnn", "gw"), lambda v: v <= 1.05),
        _value(
            "MLP, detect_anomaly / graphwatch default", ">= 2.5x", ratio("mlp", "anomaly", "gw"), lambda v: v >= 2.5
        ),
        _value("MLP, lightest (level='light') / bare", "<= 1.10x", ratio("mlp", "light"), lambda v: v <= 1.10),
    ]
    small, big = results.get("rnn10k"), results.get("rnn100k")
    out += _deep_targets(small, big, headroom)
    if long is not None:
        out += _long_targets(long)
    return out


def _deep_targets(small: WorkloadResult | None, big: WorkloadResult | None, headroom: int) -> list[Target]:
    out = []
    name = "100k-node / 10k-node cost per step, graphwatch default"
    if small and big and "gw" in small.results and "gw" in big.results:
        value = scaling(small, big, "gw", steady=True)
        measured = (
            f"{value:.2f}x per step after the first (bare {scaling(small, big, 'bare', steady=True):.2f}x; "
            f"graphwatch's added cost {scaling(small, big, 'gw', added=True, steady=True):.2f}x); "
            f"{scaling(small, big, 'gw'):.2f}x with the first step's one-off snapshot and records"
        )
        out.append(Target(name, "<= 10x", measured, value <= 10))
    else:
        out.append(Target(name, "<= 10x", "-", None))
    deep = [r for r in (small, big) if r is not None]
    if deep:
        recursion = [f"{r.workload.name}/{c}: {e}" for r in deep for c, e in r.errors.items() if "Recursion" in e]
        limit = max((r.recursion_limit or 0) for r in deep)
        measured = "; ".join(recursion) or f"no Python RecursionError (limit {limit}), no crash"
        goal = f"runs under sys.setrecursionlimit(depth+{headroom}), in the benchmark's own process"
        out.append(Target("no recursion on deep graphs", goal, measured, not recursion))
    if big and "gw" in big.results:
        worst = worst_end_step(big)
        out.append(
            Target(
                "step-end analysis (Session._end_step), 100k nodes, worst call",
                "< 1 s",
                "-" if math.isnan(worst) else f"{worst * 1e3:.2f} ms",
                None if math.isnan(worst) else worst < 1.0,
            )
        )
        out.append(
            _value(
                "graph walk before backward (BackwardWatch.walk_before, snapshot excluded), 100k nodes, median",
                "< 1 s (same budget)",
                med(walks_without_snapshot(big)),
                lambda v: v < 1.0,
                "s",
            )
        )
    return out


def _long_targets(long: LongRun) -> list[Target]:
    note = f" ({long.steps_done:,} steps)" if long.steps_done != long.steps else ""
    value = long.memory_estimate / 2**20
    extrapolated = long.traced_per_step * long.steps / 2**20
    memory = Target(
        f"graphwatch's own memory after a {long.steps:,}-step run{note}",
        "< 50 MB",
        f"{value:.1f} MB RSS growth beyond bare; tracemalloc: {long.traced_per_step:.0f} bytes/step "
        f"= {extrapolated:.1f} MB at {long.steps:,} steps",
        value < 50 and extrapolated < 50,
    )
    trace = _value(
        f"saved trace JSON after a {long.steps:,}-step run{note}",
        "< 20 MB",
        long.trace_bytes / 2**20,
        lambda v: v < 20,
        "MB",
    )
    return [memory, trace]


# issue 15: (workload, goal for graphwatch default / bare)
ISSUE_15_GOALS = (
    ("mlp", 1.30), ("lstmcell", 1.30), ("rnn10k", 1.30), ("rnn100k", 1.30), ("cnn", 1.05), ("transformer", 1.10),
)  # fmt: skip


def issue_15_rows(results: dict[str, WorkloadResult]) -> list[str]:
    """Issue 15's goals per workload, beside ``floor`` (the least a Python tool that knows each saved tensor's
    lifetime must do): a goal below the floor cannot be met by graphwatch's Python, however fast the rest."""
    rows = []
    for name, goal in ISSUE_15_GOALS:
        r = results.get(name)
        if r is None or "gw" not in r.results:
            continue
        gw, steady = r.ratio("gw"), r.ratio("gw", steady=True)
        floor = r.ratio("floor") if "floor" in r.results else float("nan")
        floor_steady = r.ratio("floor", steady=True) if "floor" in r.results else float("nan")
        if floor > goal:
            status = "**below the Python floor**"
        else:
            status = "**met**" if gw <= goal else "**MISSED**"
        rows.append(
            f"| {name} | <= {goal:.2f}x | {gw:.2f}x ({steady:.2f}x) | {floor:.2f}x ({floor_steady:.2f}x) | {status} |"
        )
    anomaly = {name: r.ratio("anomaly", "gw") for name, r in results.items() if {"gw", "anomaly"} <= set(r.results)}
    measured = ", ".join(f"{name} {value:.2f}x" for name, value in anomaly.items()) or "-"
    met = "**met**" if anomaly and min(anomaly.values()) >= 3 else "**MISSED**"
    rows.append(f"| detect_anomaly / default, every workload | >= 3x | {measured} | - | {met} |")
    return rows
