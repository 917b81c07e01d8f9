"""The measures of the default level's adaptive capture (issue 25), whose goals issue 42 made stricter
(``targets.small_step_rows``).

- **Steady state**: sessions of :data:`STEADY_STEPS` steps (:data:`DEEP_STEADY_STEPS` on the 100k-node graph,
  whose steps take most of a second), the mean CPU time per step from step :data:`STEADY_FROM` on, paired
  with bare torch round by round, for the default level (first, sampled and suspicious steps in full detail),
  the full level (every step, the default before issue 25), the light level, the floor, the light level's
  floor (``configs.py``) and detect_anomaly.
- **Whole runs**: :data:`WHOLE_STEPS` steps of the MLP and of LSTMCell, entering and leaving the session
  included (its first steps' walks and snapshot, its exit's findings), paired with the same steps bare; the
  light level's floor beside it.
- **Kept graphs**: ``total_loss += loss`` for :data:`KEPT_STEPS` steps under the default level, the CPU time
  per step over the :data:`KEPT_WINDOW` steps up to step 10,000 against the same up to step 1,000
  (``kept_graphs.py``).
"""

from __future__ import annotations

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
WHOLE_CONFIGS = ("bare", "gw", "light", "light_floor")
KEPT_STEPS, KEPT_WINDOW = 10_000, 500


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
        results.update(measure([(workload, WHOLE_STEPS, count)], list(WHOLE_CONFIGS), headroom, log))
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
