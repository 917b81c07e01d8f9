"""Times that blame the right thing: each backward and step is recorded in wall-clock time and in CPU time of
the process (what a loaded machine or a wait does not inflate), both shown with their labels, and the summary
says how much of the run graphwatch itself took.  (These tests check what is recorded and shown, not how fast
anything is: speed is measured in benchmarks/.)"""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import torch

import graphwatch
from graphwatch.analysis.growth import live_counts_measured
from graphwatch.capture.hooks.own_time import saved_hook_cost
from graphwatch.model import Trace
from graphwatch.model.records import OWN_ESTIMATED
from graphwatch.rendering.html import write_report
from graphwatch.rendering.terminal import make_console, print_summary
from graphwatch.rendering.wording import time_text

WAIT = 0.2  # seconds a backward waits (sleeping: no CPU)


class WaitingBackward(torch.autograd.Function):
    """Identity whose backward waits: wall-clock time that is not CPU time, as on a machine busy elsewhere."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        time.sleep(WAIT)
        return grad


def run(steps: int = 3) -> graphwatch.Session:
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        for _ in range(steps):
            opt.zero_grad()
            WaitingBackward.apply(model(torch.randn(4, 8)).tanh()).sum().backward()
            opt.step()
    return gw


def test_a_backward_that_waits_takes_wall_clock_time_but_no_cpu_time() -> None:
    gw = run()
    for backward in gw.trace.backwards:
        assert backward.seconds >= WAIT and backward.cpu_seconds < backward.seconds - WAIT / 2, backward
    for step in gw.trace.steps:
        if step.backwards:
            assert step.backward_seconds >= WAIT and step.backward_cpu_seconds < step.backward_seconds - WAIT / 2
            assert step.seconds >= step.backward_seconds and step.cpu_seconds > 0
    trace = gw.trace
    assert trace.seconds >= 3 * WAIT and 0 < trace.cpu_seconds < trace.seconds - WAIT


def test_graphwatchs_own_time_is_its_parts_and_the_hooks_estimate() -> None:
    gw = run()
    own = gw.trace.own_seconds
    assert set(own) == {"around backwards", "step ends", "optimizer hooks", OWN_ESTIMATED}
    assert all(seconds >= 0 for seconds in own.values()) and own["step ends"] > 0
    saved = sum(step.saved_packed for step in gw.trace.steps)
    assert saved > 0 and own[OWN_ESTIMATED] == saved * saved_hook_cost()
    assert sum(own.values()) < gw.trace.seconds  # (a part of the run, measured inside it)


def test_the_light_level_has_no_saved_tensor_hooks_to_estimate() -> None:
    with graphwatch.watch(summary=False, level="light") as gw:
        (torch.ones(2, requires_grad=True) * 2).sum().backward()
    assert OWN_ESTIMATED not in gw.trace.own_seconds and "around backwards" in gw.trace.own_seconds


def test_the_summary_labels_both_clocks_and_says_what_graphwatch_took() -> None:
    gw = run()
    out = io.StringIO()
    print_summary(gw.trace, console=make_console(out))
    text = out.getvalue()
    assert "backward\n" not in text and "wall clock" in text and "CPU" in text  # the table's two columns
    line = next(line for line in text.splitlines() if line.startswith("time: "))
    assert line == time_text(gw.trace)
    assert "wall clock" in line and " CPU" in line and "graphwatch itself: about " in line
    assert "at step ends" in line and "in saved-tensor hooks (estimated)" in line
    # the process waited for most of the run: the summary says the time was not its CPU's
    assert "the process had a CPU for" in line


def test_times_survive_the_trace_file_and_an_older_trace_shows_none(tmp_path) -> None:
    gw = run(2)
    loaded = graphwatch.load(gw.save(tmp_path / "trace.json"))
    assert (loaded.seconds, loaded.cpu_seconds, loaded.own_seconds) == (
        gw.trace.seconds, gw.trace.cpu_seconds, gw.trace.own_seconds
    )
    assert [b.cpu_seconds for b in loaded.backwards] == [b.cpu_seconds for b in gw.trace.backwards]
    assert time_text(Trace()) == ""  # a trace that recorded no times (an older graphwatch's) claims none
    out = io.StringIO()
    print_summary(Trace(steps=loaded.steps[:]), console=make_console(out))
    assert "backward\nCPU" not in out.getvalue() and "CPU" not in out.getvalue()


def test_measuring_the_hooks_cost_never_calls_the_users_own_saved_tensor_hooks() -> None:
    """The once-per-process measurement runs in a thread of its own: a user's hooks around the session see
    exactly the tensors they see without graphwatch."""
    packed: list[tuple[int, ...]] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        packed.append(tuple(tensor.shape))
        return tensor

    def train() -> None:
        x = torch.ones(3, requires_grad=True)
        x.exp().sum().backward()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        train()
        bare = list(packed)
        packed.clear()
        saved_hook_cost.cache_clear()  # measured again, at this session's end
        with graphwatch.watch(summary=False) as gw:
            train()
    assert packed == bare == [(3,)] and gw.trace.own_seconds[OWN_ESTIMATED] > 0


def test_a_step_seen_light_reads_no_cpu_clock_and_shows_its_backward_cpu_as_not_measured(tmp_path: Path) -> None:
    """The process's CPU clock is a system call (1-2 us, more on a loaded machine): a step seen light and its backward
    record their wall-clock time only, and both tables say its CPU time was not measured, where a step seen in full
    detail shows it."""
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with graphwatch.watch(summary=False, snapshots="off") as gw:  # the default level: steps 0-2 in full detail
        for _ in range(6):
            opt.zero_grad()
            model(torch.randn(4, 8)).pow(2).sum().backward()
            opt.step()
    trace, measured = gw.trace, live_counts_measured(gw.trace)
    light = {s.index for s in trace.steps if s.backwards and not measured(s.index)}
    full = {s.index for s in trace.steps if s.backwards and measured(s.index)}
    assert light and full
    for backward in trace.backwards:
        assert backward.seconds > 0 and (backward.cpu_seconds > 0) is (backward.step in full), backward
    for step in trace.steps:  # (the step's own span too: its CPU time is read where a step seen in full detail ends)
        assert step.seconds > 0 and (step.cpu_seconds > 0) is (step.index in full), step
    assert 0 < trace.cpu_seconds  # (the session's whole CPU time: read at its start and end)
    out = io.StringIO()
    print_summary(trace, console=make_console(out))  # (not wrapped: no terminal)
    rows = {int(m[1]): m[0] for m in re.finditer(r"^\s+(\d+)\s+[\d,]+\s.*$", out.getvalue(), re.MULTILINE)}
    for index in light | full:  # step, nodes made, "1 · wall", then the CPU column
        cpu = rows[index].split(" · ", 1)[1].split()[2]
        assert (cpu == "–") is (index in light), rows[index]
    table = write_report(trace, tmp_path).read_text().split('<table class="steps">', 1)[1].split("</table>", 1)[0]
    column = re.findall(r"<th>(.*?)</th>", table).index("backward CPU")
    cells = {int(c[0]): c[column] for c in (re.findall(r"<td>(.*?)</td>", row) for row in table.split("<tr")) if c}
    assert all((cells[index] == "–") is (index in light) for index in light | full), cells
