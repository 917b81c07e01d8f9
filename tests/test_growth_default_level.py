"""Memory growth at the default level (issue 39, point 2): whatever ``level="full"`` finds, the default level finds,
``memory-growth`` too, on real training loops that keep every step's graph (while the graphs kept grow, every step is
seen in full detail; a bounded keep goes back to light steps); and what a step seen light did not
measure (its live saved bytes, its nodes alive) is shown as not measured, "–" in the per-step tables and a gap in
the sparklines, never as 0."""

from __future__ import annotations

import io
import re
from collections import deque
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from rich.console import Console
from torch import nn

import graphwatch
from graphwatch.analysis.growth import live_counts_measured
from graphwatch.model import Trace
from graphwatch.rendering.charts import SPARK_BLOCKS, SPARK_GAP
from graphwatch.rendering.html import write_report
from graphwatch.rendering.terminal import Summary

STEPS = 40  # a short run: most of its steps are seen light at the default level


def mlp() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def train(keep: Callable[[torch.Tensor, torch.Tensor], None], steps: int = STEPS) -> None:
    """A plain training loop; ``keep(out, loss)`` is the user's bookkeeping at the end of each step."""
    model, opt = mlp()
    for _ in range(steps):
        out = model(torch.randn(16, 8))
        loss = out.pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        keep(out, loss)


def running_total(steps: int = STEPS) -> None:
    """`total = total + loss` (the flagship case)."""
    state = {"total": torch.zeros(())}

    def keep(out: torch.Tensor, loss: torch.Tensor) -> None:
        state["total"] = state["total"] + loss

    train(keep, steps)


class AverageMeter:
    """The ImageNet example's meter, fed the loss tensor: `self.sum += val * n` keeps every step's graph."""

    def __init__(self) -> None:
        self.sum: float | torch.Tensor = 0.0
        self.count = 0

    def update(self, val: float | torch.Tensor, n: int = 1) -> None:
        self.sum += val * n
        self.count += n


def meter() -> None:
    losses = AverageMeter()
    train(lambda out, loss: losses.update(loss, 16))


class MovingAverage:
    def __init__(self) -> None:
        self.value: torch.Tensor | None = None


def moving_average() -> None:
    smooth = MovingAverage()

    def keep(out: torch.Tensor, loss: torch.Tensor) -> None:
        smooth.value = loss if smooth.value is None else 0.9 * smooth.value + 0.1 * loss

    train(keep)


def replay_buffer() -> None:
    buffer: list[tuple[torch.Tensor, float]] = []
    train(lambda out, loss: buffer.append((out, loss.item())))  # the output, with its graph


def negative_queue() -> None:
    queue = {"features": torch.zeros(0, 4)}

    def keep(out: torch.Tensor, loss: torch.Tensor) -> None:
        queue["features"] = torch.cat([queue["features"], out])[-4096:]  # no detach

    train(keep)


class RunningStats:
    def __init__(self) -> None:
        self.mean = torch.zeros(4)
        self.n = 0

    def update(self, value: torch.Tensor) -> None:
        self.n += 1
        self.mean = self.mean + (value - self.mean) / self.n


def running_statistics() -> None:
    stats = RunningStats()
    train(lambda out, loss: stats.update(out.mean(0)))


PROGRAMS = {
    "total": running_total,
    "meter": meter,
    "moving-average": moving_average,
    "replay-buffer": replay_buffer,
    "negative-queue": negative_queue,
    "running-statistics": running_statistics,
}


def watched(program: Callable[[], None], level: str) -> Trace:
    with graphwatch.watch(summary=False, snapshots="off", level=level) as gw:
        program()
    return gw.trace


def kinds(trace: Trace) -> set[str]:
    return {finding.kind for finding in trace.findings}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_the_default_level_finds_what_the_full_level_finds_memory_growth_too(name: str) -> None:
    default, full = watched(PROGRAMS[name], "default"), watched(PROGRAMS[name], "full")
    assert "memory-growth" in kinds(full)
    assert kinds(default) == kinds(full)
    growth = {trace.options["level"]: next(f for f in trace.findings if f.kind == "memory-growth") for trace in (default, full)}
    assert growth["default"].evidence == growth["full"].evidence  # the same steps fitted, the same figures
    # seen in full detail because the graphs kept grew, not because every step is
    assert any(span.reason.startswith("more graphs of earlier steps alive") for span in default.full_detail)


@pytest.mark.parametrize("steps", [20, 80])
def test_a_running_total_grows_at_the_default_level_on_short_and_longer_runs(steps: int) -> None:
    trace = watched(lambda: running_total(steps), "default")
    growth = next(f for f in trace.findings if f.kind == "memory-growth")
    assert growth.evidence["explained_by"] and growth.evidence["explained_by"][0].startswith("graph-kept-alive")
    # every step's live counts were measured: from the first steps on, the kept graphs grew at each step's end
    assert growth.evidence["fitted_steps"] == steps and all(live_counts_measured(trace)(i) for i in range(steps))
    assert f"by step {10 * steps}" in growth.message  # the projection is for ten times the run


def late_leak(clean: int = 30, leaking: int = 40) -> None:
    """A clean loop that starts `total = total + loss` after ``clean`` steps (a branch taken late)."""
    state = {"total": torch.zeros(()), "step": 0}

    def keep(out: torch.Tensor, loss: torch.Tensor) -> None:
        state["step"] += 1
        if state["step"] > clean:
            state["total"] = state["total"] + loss

    train(keep, clean + leaking)


def bounded_window() -> None:
    """The last five losses kept (a bounded window): the kept graphs stop growing."""
    window: deque[torch.Tensor] = deque(maxlen=5)
    train(lambda out, loss: window.append(loss), 60)


def test_a_leak_that_starts_after_steps_seen_light_is_seen_in_full_detail_from_then_on() -> None:
    default, full = watched(late_leak, "default"), watched(late_leak, "full")
    assert kinds(default) == kinds(full) == {"graph-kept-alive", "memory-growth"}
    measured = live_counts_measured(default)
    assert not any(measured(i) for i in range(3, 30))  # the clean steps: light
    assert all(measured(i) for i in range(32, 70))  # from the leak's second step on: every step measured
    growth = {t.options["level"]: next(f for f in t.findings if f.kind == "memory-growth").evidence for t in (default, full)}
    assert growth["default"]["nodes"] == growth["full"]["nodes"]


def late_appends(clean: int = 10, leaking: int = 20) -> None:
    """Losses appended to a list from step ``clean`` on (Lightning's example, a store filled after warm-up): an
    append makes no node, so no step makes more than the one before it, and the list is found by a look at what
    the frames hold some light steps later."""
    kept: list[torch.Tensor] = []
    state = {"step": 0}

    def keep(out: torch.Tensor, loss: torch.Tensor) -> None:
        state["step"] += 1
        if state["step"] > clean:
            kept.append(loss)

    train(keep, clean + leaking)


def test_a_late_leak_found_some_light_steps_after_it_started_shows_the_growth_full_shows() -> None:
    """The steps seen light between the leak's start and the look that found it kept the graphs the last step
    still holds: each counts what is alive from its own step and before, as at ``level="full"``."""
    default, full = watched(late_appends, "default"), watched(late_appends, "full")
    measured = live_counts_measured(default)
    assert not all(measured(i) for i in range(10, 20))  # found some light steps after it started
    assert kinds(default) == kinds(full) == {"graph-kept-alive", "memory-growth"}
    growth = {t.options["level"]: next(f for f in t.findings if f.kind == "memory-growth").evidence for t in (default, full)}
    assert growth["default"]["nodes"] == growth["full"]["nodes"]
    assert abs(growth["default"]["nodes_per_step"] - growth["full"]["nodes_per_step"]) < 0.25 * growth["full"]["nodes_per_step"]


def test_a_bounded_window_of_kept_graphs_goes_back_to_light_steps_once_it_stops_growing() -> None:
    default, full = watched(bounded_window, "default"), watched(bounded_window, "full")
    assert kinds(default) == kinds(full) and "memory-growth" not in kinds(default)
    measured = live_counts_measured(default)
    assert not any(measured(i) for i in range(20, 60))  # the window is full by step 5: light again after the hold


def render(trace: Trace) -> str:
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(Summary(trace))
    return console.file.getvalue()


def keeps_the_first_steps(kept: int = 6) -> None:
    """The losses of the first ``kept`` steps kept in a list (nodes alive rise, then stay: later steps are seen
    light)."""
    losses: list[torch.Tensor] = []
    train(lambda out, loss: losses.append(loss) if len(losses) < kept else None)


def test_steps_seen_light_show_not_measured_in_the_table_and_a_gap_in_the_sparklines() -> None:
    trace = watched(keeps_the_first_steps, "default")
    measured = live_counts_measured(trace)
    light = [step.index for step in trace.steps if not measured(step.index)]
    assert light, "no step was seen light"
    out = render(trace)
    rows = {int(m[1]): m[0] for m in re.finditer(r"^\s+(\d+)\s+[\d,]+\s.*$", out, re.MULTILINE)}
    assert any(index in light for index in rows), "the table shows no step seen light"
    for index, row in rows.items():  # live saved, then nodes alive, then what was first seen there
        live_cells = re.search(r"(–|[\d.]+ [KMG]?i?B)\s+(–|[\d,]+)(\s|$)", row.split(" ms ")[-1])
        assert live_cells is not None, row
        assert (live_cells[1], live_cells[2]) == ("–", "–") if index in light else "–" not in live_cells[0], row
    nodes_line = next(line.rstrip() for line in out.splitlines() if line.startswith("nodes alive"))
    last_measured = max(i for i in range(len(trace.steps)) if measured(i) and trace.steps[i].source != "session-end")
    first, last = trace.steps[0].live_nodes, trace.steps[last_measured].live_nodes
    top = max(range(last_measured + 1), key=lambda i: trace.steps[i].live_nodes)  # (the first step at the max)
    assert top < last_measured and trace.steps[top].live_nodes == last  # (the list stopped growing: light after)
    ends = f"{first:,} → {last:,} at step {last_measured} (max {last:,}, step {top})"
    assert nodes_line.endswith(ends)
    columns = nodes_line[len("nodes alive") : -len(ends)]  # padding, one column a step (41 < the width), padding
    drawn = columns.strip(" ")
    assert drawn[-1] == SPARK_BLOCKS[-1] and all(c in SPARK_BLOCKS for c in drawn)
    assert len(drawn) == len(trace.steps) - len(light)  # a block for each measured step (they come first here)...
    assert columns.endswith(SPARK_GAP * len(light))  # ...and a gap for each step seen light, never a low block


def test_a_full_level_run_measures_every_step_and_shows_no_gap() -> None:
    trace = watched(running_total, "full")
    out = render(trace)
    assert all(live_counts_measured(trace)(step.index) for step in trace.steps)
    nodes_line = next(line for line in out.splitlines() if line.startswith("nodes alive"))
    assert nodes_line.split()[2][0] == "▁" and " at step " not in nodes_line


def test_the_html_table_shows_not_measured_for_steps_seen_light(tmp_path: Path) -> None:
    trace = watched(keeps_the_first_steps, "default")
    table = write_report(trace, tmp_path).read_text().split('<table class="steps">', 1)[1].split("</table>", 1)[0]
    head = re.findall(r"<th>(.*?)</th>", table)
    rows = {int(cells[0]): cells for cells in (re.findall(r"<td>(.*?)</td>", row) for row in table.split("<tr")) if cells}
    live = [head.index("live saved"), head.index("nodes alive")]
    measured = live_counts_measured(trace)
    assert any(not measured(index) for index in rows) and any(measured(index) for index in rows)
    for index, cells in rows.items():
        assert all((cells[i] == "–") is not measured(index) for i in live), cells


def test_the_light_level_measures_no_live_count() -> None:
    trace = watched(running_total, "light")
    assert not any(live_counts_measured(trace)(step.index) for step in trace.steps)
    assert "not measured" in render(trace)


def test_an_evaluation_graph_held_from_one_evaluation_to_the_next_is_found_at_the_default_level_as_at_full() -> None:
    """nanoGPT's ``estimate_loss()`` without ``no_grad``, run every 20 steps: the variable holds one evaluation's graph
    (megabytes of saved tensors) until the next.  Step 0's evaluation is set-up; the one at step 20 runs on a step
    seen light, with as many nodes as step 0's, so only a look at what the frames hold, after it, tells."""

    def program() -> None:
        model, opt = mlp()
        val_x = torch.randn(256, 8)
        val_loss = None
        for step in range(41):
            if step % 20 == 0:
                val_loss = model(val_x).pow(2).mean()  # no torch.no_grad(): a graph, kept until the next evaluation
            loss = model(torch.randn(16, 8)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        assert val_loss is not None

    default, full = watched(program, "default"), watched(program, "full")
    assert "graph-kept-alive" in kinds(full)
    assert kinds(default) == kinds(full)
    assert any(span.reason.startswith("`val_loss` holds a graph of step 20") for span in default.full_detail)


def estimate_loss_program() -> None:
    """nanoGPT's ``estimate_loss()`` without its ``@torch.no_grad()``: a few losses written into a tensor, every 20
    steps, and their mean kept in ``val_loss`` until the next evaluation.  Its second layer saves its weight's
    transpose, a view that the optimizer's steps change in place since."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def estimate_loss() -> torch.Tensor:
        losses = torch.zeros(5)
        for k in range(5):
            losses[k] = model(torch.randn(32, 8)).pow(2).mean()
        return losses.mean()

    val_loss = None
    for step in range(41):
        if step % 20 == 0:
            val_loss = estimate_loss()  # at: evaluation
        loss = model(torch.randn(16, 8)).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    assert val_loss is not None


def test_a_kept_evaluation_seen_light_gets_the_no_grad_fix_that_the_full_level_gives() -> None:
    """Found from a step seen light, the evaluation is told from the training forward as at the full level: no
    backward ran through what ``val_loss`` holds (every backward since freed its graph, and that graph still keeps
    its saved tensors), and the training forward's nodes of a step not finished yet take no line from the
    evaluation that starts step 0 with the same ops.  So the fix is the same: the evaluation's line under
    ``no_grad``, a patch."""
    default, full = watched(estimate_loss_program, "default"), watched(estimate_loss_program, "full")
    fixes = {}
    for trace in (default, full):
        finding = next(f for f in trace.findings if f.kind == "graph-kept-alive")
        edit = finding.remedies[0].edits[0]
        fixes[trace.options["level"]] = (edit.kind, edit.line, finding.patch is not None)
    line = marked_line("evaluation")
    assert fixes == {"default": ("no-grad", line, True), "full": ("no-grad", line, True)}


def test_reading_a_light_steps_saved_tensors_after_the_fact_makes_no_autograd_node() -> None:
    """A census reads the saved tensors of a graph made on a step seen light; one of them a view of a parameter
    that an optimizer step changed since (``weight.t()``).  Asking a stale view whether it is a leaf would rebuild
    its autograd node: graphwatch must not make nodes in the user's graphs, so every step makes as many as bare."""
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        estimate_loss_program()
    made = [step.nodes_created for step in gw.trace.steps]
    training = made[1]  # a step with no evaluation: the training forward's nodes
    assert all(count == training for i, count in enumerate(made) if i % 20 and i < 40), made


def marked_line(tag: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith(f"# at: {tag}"))
