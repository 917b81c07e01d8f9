"""The goals RESULTS.md checks the measured figures against: issue 42's (small steps, with issue 25's that stand),
issue 5's targets and issue 15's goals beside the Python floor."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from adaptive import KEPT_STEPS, KEPT_WINDOW, STEADY_FROM, KeptWindows
from deep_graph import scaling, walks_without_snapshot, worst_end_step
from longrun import LongRun
from measure import WorkloadResult, fmt_x, med
from whole_process import ProcessResult

# issue 42's goals, which replace issue 25's where stricter
STEADY_GOAL = 1.10  # default level / bare, steady state, every workload
WHOLE_GOAL = 1.20  # default level / bare, whole run of adaptive.WHOLE_STEPS steps
LIGHT_MARGIN = 0.02  # light level / bare at most this above light_floor / bare, every workload
PROCESS_GOAL = 1.20  # graphwatch run / python, whole process of the step-per-backward script
# issue 25's goals that stand
ANOMALY_GOAL = 0.5  # default / detect_anomaly, where detect_anomaly costs over ANOMALY_COSTLY
ANOMALY_COSTLY = 1.5
KEPT_GOAL = 1.2


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


def _status(value: float, ok: bool, floor: float = math.nan, goal: float = math.nan) -> str:
    if math.isnan(value):
        return "not measured"
    if not ok and not math.isnan(floor) and floor > goal:
        return "**MISSED** (the floor is above the goal)"
    return "**met**" if ok else "**MISSED**"


def _from(result: WorkloadResult, config: str, base: str = "bare") -> float:
    """Steady-state ratio of ``config`` to ``base`` (nan where either was not measured)."""
    return result.ratio_from(config, STEADY_FROM, base) if {config, base} <= set(result.results) else math.nan


def small_step_rows(
    steady: dict[str, WorkloadResult],
    whole: dict[str, WorkloadResult],
    kept: KeptWindows | None,
    process: ProcessResult | None,
) -> list[str]:
    """The rows of RESULTS.md's goal table: issue 42's goals, then issue 25's that stand (measure, goal, measured,
    the floor beside it, status)."""
    rows = []
    for name, result in steady.items():
        gw, light_floor, floor = _from(result, "gw"), _from(result, "light_floor"), _from(result, "floor")
        rows.append(
            f"| {name}: default level, steady state (steps {STEADY_FROM}-{result.steps - 1} of {result.steps}-step "
            f"sessions) | <= {STEADY_GOAL:.2f}x | {fmt_x(gw)} (every step in full detail: {fmt_x(_from(result, 'gw_full'))}) "
            f"| light step {fmt_x(light_floor)}, full step {fmt_x(floor)} "
            f"| {_status(gw, gw <= STEADY_GOAL, light_floor, STEADY_GOAL)} |"
        )
    for name, result in whole.items():
        gw = result.whole_ratio("gw")
        light_floor = result.whole_ratio("light_floor") if "light_floor" in result.results else math.nan
        rows.append(
            f"| {name}: default level, whole run of {result.steps} steps (entering and leaving included) "
            f"| <= {WHOLE_GOAL:.2f}x | {fmt_x(gw)} | light step {fmt_x(light_floor)} "
            f"| {_status(gw, gw <= WHOLE_GOAL, light_floor, WHOLE_GOAL)} |"
        )
    rows.append(_light_row(steady))
    rows.append(_process_row(process))
    rows.append(_anomaly_row(steady))
    if kept is not None:
        rows.append(
            f"| `total_loss += loss`: ms/step before step {KEPT_STEPS:,} / before step {KEPT_STEPS // 10:,} "
            f"({KEPT_WINDOW:,}-step windows) | <= {KEPT_GOAL:.1f}x | {kept.ratio:.2f}x ({kept.watched[0]:.3f} -> "
            f"{kept.watched[1]:.3f} ms; bare {kept.bare[0]:.3f} -> {kept.bare[1]:.3f}) | - "
            f"| {_status(kept.ratio, kept.ratio <= KEPT_GOAL)} |"
        )
    return rows


def _light_row(steady: dict[str, WorkloadResult]) -> str:
    """The light level's steady state against its floor's, workload by workload."""
    pairs = {name: (_from(r, "light"), _from(r, "light_floor")) for name, r in steady.items()}
    pairs = {name: pair for name, pair in pairs.items() if not any(map(math.isnan, pair))}
    shown = ", ".join(f"{name} {light:.2f}x ({light - floor:+.2f})" for name, (light, floor) in pairs.items()) or "-"
    floors = ", ".join(f"{name} {floor:.2f}x" for name, (_, floor) in pairs.items()) or "-"
    over = [name for name, (light, floor) in pairs.items() if round(light - floor, 2) > LIGHT_MARGIN]
    status = "not measured" if not pairs else f"**MISSED** ({', '.join(over)})" if over else "**met**"
    return (
        f"| lightest level (`level='light'`), steady state, every workload (in brackets: its distance to its floor) "
        f"| floor + {LIGHT_MARGIN:.2f} at most | {shown} | {floors} | {status} |"
    )


def _process_row(process: ProcessResult | None) -> str:
    """The step-per-backward script's whole process, ``graphwatch run`` against ``python``."""
    steps = f"{process.steps:,}" if process is not None else "700+"
    measure = (
        f"a step per backward, no optimizer (manual SGD, {steps} tiny steps): `graphwatch run` / `python`, "
        "whole process CPU time"
    )
    if process is None:
        return f"| {measure} | <= {PROCESS_GOAL:.2f}x | - | - | not measured |"
    gw, rounds = process.ratio("default"), len(process.timings["bare"])
    measured = (
        f"{gw:.2f}x ({process.cpu_s('default'):.2f} s against {process.cpu_s('bare'):.2f} s; `--level light` "
        f"{process.ratio('light'):.2f}x; medians of {rounds} paired round{'s' if rounds != 1 else ''})"
    )
    return f"| {measure} | <= {PROCESS_GOAL:.2f}x | {measured} | - | {_status(gw, gw <= PROCESS_GOAL)} |"


def _anomaly_row(steady: dict[str, WorkloadResult]) -> str:
    """Issue 25's default level / detect_anomaly, where detect_anomaly is costly."""
    costly = {name: r for name, r in steady.items() if _from(r, "anomaly") > ANOMALY_COSTLY}
    values = {name: _from(r, "gw", "anomaly") for name, r in costly.items()}
    shown = ", ".join(f"{name} {v:.2f}" for name, v in values.items()) or "-"
    # where detect_anomaly costs less than 1 / ANOMALY_GOAL times bare, the goal asks for less than bare itself
    beyond = {name for name, r in costly.items() if _from(r, "anomaly") * ANOMALY_GOAL < 1.0}
    missed = [name for name, v in values.items() if v > ANOMALY_GOAL and name not in beyond]
    status = "not measured" if not values else f"**MISSED** ({', '.join(missed)})" if missed else "**met**"
    if beyond:
        asks = "; ".join(f"{name}: {_from(costly[name], 'anomaly') * ANOMALY_GOAL:.2f}x bare" for name in sorted(beyond))
        status = f"{'**met** where attainable' if not missed else status} (the goal asks for less than bare on {asks})"
    return (
        f"| default level / detect_anomaly, where detect_anomaly costs over {ANOMALY_COSTLY}x (steady state) "
        f"| <= {ANOMALY_GOAL} | {shown} | - | {status} |"
    )
