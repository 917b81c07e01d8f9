"""Issue 25's measures of the default level's adaptive capture, beside the Python floor.

- **Steady state**: sessions of :data:`STEADY_STEPS` steps (:data:`DEEP_STEADY_STEPS` on the 100k-node graph,
  whose steps take most of a second), the mean CPU time per step from step :data:`STEADY_FROM` on, paired
  with bare torch round by round, for the default level (first, sampled and suspicious steps in full detail),
  the full level (every step, the default before issue 25), the light level, the floor, the light level's
  floor (``configs.py``) and detect_anomaly.
- **Whole runs**: :data:`WHOLE_STEPS` steps of the MLP and of LSTMCell, entering and leaving the session
  included (its first steps' walks and snapshot, its exit's findings), paired with the same steps bare.
- **Kept graphs**: ``total_loss += loss`` for :data:`KEPT_STEPS` steps under the default level, the CPU time
  per step over the :data:`KEPT_WINDOW` steps up to step 10,000 against the same up to step 1,000
  (``kept_graphs.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import kept_graphs
import workloads as W
from measure import Log, Shape, WorkloadResult, measure

STEADY_FROM = 10  # steps of each session left out of its steady state
STEADY_STEPS = 200
DEEP_STEADY_STEPS = {"rnn100k": 40}  # ~0.8 s a step bare: 200-step sessions would take hours in all
STEADY_ROUNDS = {"rnn10k": 3, "rnn100k": 2}  # the others: rounds
STEADY_CONFIGS = ("bare", "gw", "gw_full", "light", "floor", "light_floor", "anomaly")
WHOLE_STEPS = 120
WHOLE_WORKLOADS = ("mlp", "lstmcell")
KEPT_STEPS, KEPT_WINDOW = 10_000, 500

# issue 25's goals: (measure, goal)
STEADY_GOAL = 1.15
WHOLE_GOAL = 1.30
ANOMALY_GOAL = 0.5  # default / detect_anomaly, where detect_anomaly costs over ANOMALY_COSTLY
ANOMALY_COSTLY = 1.5
LIGHT_GOAL = 1.05
KEPT_GOAL = 1.2


@dataclass
class KeptWindows:
    """CPU ms/step of ``total_loss += loss`` over the window before step 1,000 and the one before step 10,000."""

    bare: tuple[float, float]
    watched: tuple[float, float]

    @property
    def ratio(self) -> float:
        return self.watched[1] / self.watched[0]


def steady_groups(only: set[str], rounds: int, quick: bool) -> list[list[Shape]]:
    """One group per workload: sessions of the steady-state length, rounds as given (or the defaults)."""
    groups = []
    for name, make in W.all_workloads().items():
        if only and name not in only:
            continue
        workload = make()
        steps = DEEP_STEADY_STEPS.get(name, STEADY_STEPS)
        count = rounds or STEADY_ROUNDS.get(name, 7)
        if quick:
            steps, count = max(STEADY_FROM + 20, steps // 2), max(2, count // 2)
        groups.append([(workload, steps, count)])
    return groups


def measure_steady(only: set[str], configs: list[str], rounds: int, quick: bool, headroom: int, log: Log) -> dict[str, WorkloadResult]:
    """The steady-state sessions of every workload (see the module's docstring)."""
    results: dict[str, WorkloadResult] = {}
    wanted = [c for c in STEADY_CONFIGS if c in configs]
    for group in steady_groups(only, rounds, quick):
        workload, steps, count = group[0]
        log(f"steady state, {workload.name}: {steps}-step sessions x {count} rounds ({', '.join(wanted)})")
        results.update(measure(group, wanted, headroom, log))
    return results


def measure_whole(only: set[str], rounds: int, quick: bool, headroom: int, log: Log) -> dict[str, WorkloadResult]:
    """Whole runs of :data:`WHOLE_STEPS` steps, entering and leaving included (bare, default, light)."""
    results: dict[str, WorkloadResult] = {}
    for name in WHOLE_WORKLOADS:
        if only and name not in only:
            continue
        workload = W.all_workloads()[name]()
        count = max(2, (rounds or 9) // (2 if quick else 1))
        log(f"whole runs, {name}: {WHOLE_STEPS} steps x {count} rounds")
        results.update(measure([(workload, WHOLE_STEPS, count)], ["bare", "gw", "light"], headroom, log))
    return results


def measure_kept(steps: int, window: int, log: Log) -> KeptWindows:
    """``total_loss += loss``, bare and watched: ms/step over the window before step ``steps // 10`` and
    before step ``steps``."""
    early = steps // 10
    found = []
    for watched in (False, True):
        timings = kept_graphs.run(steps, watched)
        found.append((timings.window(early - window, early)[0], timings.window(steps - window, steps)[0]))
        log(f"kept graphs, {'watched' if watched else 'bare'}: {found[-1][0]:.3f} ms/step before step {early:,}, "
            f"{found[-1][1]:.3f} before step {steps:,}")
    return KeptWindows(found[0], found[1])


def _status(value: float, ok: bool, floor: float = math.nan, goal: float = math.nan) -> str:
    if math.isnan(value):
        return "not measured"
    if not ok and not math.isnan(floor) and floor > goal:
        return "**MISSED** (the floor is above the goal)"
    return "**met**" if ok else "**MISSED**"


def issue_25_rows(
    steady: dict[str, WorkloadResult], whole: dict[str, WorkloadResult], kept: KeptWindows | None
) -> list[str]:
    """The rows of RESULTS.md's issue-25 table: measure, goal, measured, the floor beside it, status."""

    def ratio(result: WorkloadResult, config: str, base: str = "bare") -> float:
        return result.ratio_from(config, STEADY_FROM, base) if {config, base} <= set(result.results) else math.nan

    rows = []
    for name, result in steady.items():
        gw, floor, full = ratio(result, "gw"), ratio(result, "floor"), ratio(result, "gw_full")
        steps = result.steps
        rows.append(
            f"| {name}: default level, steady state (steps {STEADY_FROM}-{steps - 1} of {steps}-step sessions) "
            f"| <= {STEADY_GOAL:.2f}x | {gw:.2f}x (every step in full detail: {full:.2f}x) | {floor:.2f}x "
            f"| {_status(gw, gw <= STEADY_GOAL, floor, STEADY_GOAL)} |"
        )
    for name, result in whole.items():
        gw = result.whole_ratio("gw")
        rows.append(
            f"| {name}: default level, whole run of {result.steps} steps (entering and leaving included) "
            f"| <= {WHOLE_GOAL:.2f}x | {gw:.2f}x | - | {_status(gw, gw <= WHOLE_GOAL)} |"
        )
    costly = {name: r for name, r in steady.items() if ratio(r, "anomaly") > ANOMALY_COSTLY}
    values = {name: ratio(r, "gw", "anomaly") for name, r in costly.items()}
    shown = ", ".join(f"{name} {v:.2f}" for name, v in values.items()) or "-"
    # where detect_anomaly costs less than 1 / ANOMALY_GOAL times bare, the goal asks for less than bare itself
    beyond = {name for name, r in costly.items() if ratio(r, "anomaly") * ANOMALY_GOAL < 1.0}
    missed = [name for name, v in values.items() if v > ANOMALY_GOAL and name not in beyond]
    status = "not measured" if not values else f"**MISSED** ({', '.join(missed)})" if missed else "**met**"
    if beyond:
        asks = "; ".join(f"{name}: {ratio(costly[name], 'anomaly') * ANOMALY_GOAL:.2f}x bare" for name in sorted(beyond))
        status = f"{'**met** where attainable' if not missed else status} (the goal asks for less than bare on {asks})"
    rows.append(
        f"| default level / detect_anomaly, where detect_anomaly costs over {ANOMALY_COSTLY}x (steady state) "
        f"| <= {ANOMALY_GOAL} | {shown} | - | {status} |"
    )
    light = {name: ratio(r, "light") for name, r in steady.items()}
    floors = {name: ratio(r, "light_floor") for name, r in steady.items()}
    shown = ", ".join(f"{name} {v:.2f}x" for name, v in light.items() if not math.isnan(v)) or "-"
    floors_shown = ", ".join(f"{name} {v:.2f}x" for name, v in floors.items() if not math.isnan(v)) or "-"
    measured = {name: v for name, v in light.items() if not math.isnan(v)}
    worst_name = max(measured, key=measured.__getitem__, default="")
    worst = measured.get(worst_name, math.nan)
    floor = floors.get(worst_name, math.nan)  # (the goal is below the floor where the worst workload's floor is over it)
    rows.append(
        f"| lightest level (`level='light'`), steady state, every workload | <= {LIGHT_GOAL:.2f}x | {shown} "
        f"| {floors_shown} | {_status(worst, worst <= LIGHT_GOAL, floor, LIGHT_GOAL)} |"
    )
    if kept is not None:
        rows.append(
            f"| `total_loss += loss`: ms/step before step {KEPT_STEPS:,} / before step {KEPT_STEPS // 10:,} "
            f"({KEPT_WINDOW:,}-step windows) | <= {KEPT_GOAL:.1f}x | {kept.ratio:.2f}x ({kept.watched[0]:.3f} -> "
            f"{kept.watched[1]:.3f} ms; bare {kept.bare[0]:.3f} -> {kept.bare[1]:.3f}) | - "
            f"| {_status(kept.ratio, kept.ratio <= KEPT_GOAL)} |"
        )
    return rows
