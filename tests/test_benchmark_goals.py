"""The overhead benchmark's step-per-backward workload and how it judges issue 42's goals.

No timings (speed is measured in benchmarks/, never in tests): the workload is run for real, bare and watched, to
check what it is (a step per backward, no optimizer, 700+ steps) and that graphwatch leaves its result unchanged;
the goal rows are given figures chosen on either side of each goal, to check the verdict they print.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import graphwatch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import workloads
from import_cost import Timing
from measure import RoundResult, WorkloadResult
from targets import small_step_rows
from whole_process import ProcessResult

pytestmark = pytest.mark.usefixtures("one_thread")  # (conftest: one torch thread, no session left)


def test_manual_sgd_is_a_step_per_backward_without_optimizer_and_watching_it_changes_nothing() -> None:
    bare = workloads.manual_sgd()
    for _ in range(workloads.SGD_STEPS):
        bare.step()
    watched = workloads.manual_sgd()
    with graphwatch.watch(summary=False) as gw:
        for _ in range(workloads.SGD_STEPS):
            watched.step()
    assert workloads.SGD_STEPS >= 700
    assert len(gw.trace.steps) == len(gw.trace.backwards) == workloads.SGD_STEPS
    assert not any(step.optimizer_steps for step in gw.trace.steps)
    assert all(torch.equal(a, b) for a, b in zip(bare.params, watched.params, strict=True))


def _steady(name: str, ms: dict[str, float]) -> WorkloadResult:
    """A workload measured in one 20-step round per configuration, every step taking ``ms[config]`` CPU ms."""
    rounds = {config: [RoundResult([each / 1e3] * 20, [each / 1e3] * 20)] for config, each in ms.items()}
    return WorkloadResult(workloads.Workload(name, "", lambda: None, 20, 1), 20, 1, list(rounds), rounds, {})


def _row(rows: list[str], starts: str) -> str:
    (row,) = [row for row in rows if row.startswith(f"| {starts}")]
    return row


def test_light_level_goal_is_missed_by_the_workloads_over_two_hundredths_above_their_floor() -> None:
    steady = {
        "near": _steady("near", {"bare": 1.0, "light": 1.03, "light_floor": 1.02}),
        "far": _steady("far", {"bare": 1.0, "light": 1.10, "light_floor": 1.05}),
    }
    row = _row(small_step_rows(steady, {}, None, None), "lightest level")
    assert "near 1.03x (+0.01), far 1.10x (+0.05)" in row and row.endswith("| **MISSED** (far) |")
    del steady["far"]
    assert _row(small_step_rows(steady, {}, None, None), "lightest level").endswith("| **met** |")


def test_default_level_steady_goal_is_ten_percent_and_names_a_light_floor_above_it() -> None:
    steady = {
        "met": _steady("met", {"bare": 1.0, "gw": 1.09, "light_floor": 1.02}),
        "missed": _steady("missed", {"bare": 1.0, "gw": 1.12, "light_floor": 1.05}),
        "blocked": _steady("blocked", {"bare": 1.0, "gw": 1.15, "light_floor": 1.12}),
    }
    rows = small_step_rows(steady, {}, None, None)
    assert "| <= 1.10x | 1.09x" in _row(rows, "met:") and _row(rows, "met:").endswith("| **met** |")
    assert _row(rows, "missed:").endswith("| **MISSED** |")
    assert _row(rows, "blocked:").endswith("| **MISSED** (the floor is above the goal) |")


def test_whole_process_goal_is_graphwatch_run_against_python_at_most_1_2x() -> None:
    def process(default_s: float) -> ProcessResult:
        timings = {"bare": 2.0, "default": default_s, "light": 2.1}
        return ProcessResult(758, {name: [Timing(0.0, cpu, "")] for name, cpu in timings.items()})

    met = _row(small_step_rows({}, {}, None, process(2.3)), "a step per backward")
    assert "manual SGD, 758 tiny steps" in met and "| 1.15x (2.30 s against 2.00 s" in met
    assert met.endswith("| **met** |")
    assert _row(small_step_rows({}, {}, None, process(2.5)), "a step per backward").endswith("| **MISSED** |")
    assert _row(small_step_rows({}, {}, None, None), "a step per backward").endswith("| not measured |")
