"""A run in which no backward ran in the watched process says "nothing watched", with what to do, in the
terminal summary, the report and what its trace re-renders, never "no graph leaks" (issue 39).

Nothing watched is no leak: ``--strict`` does not fail such a run (its exit code stays the script's).  Real
scripts run by ``graphwatch run`` in their own processes; training in ``torch.multiprocessing`` children.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import warm_python
from rich.console import Console

import graphwatch
from graphwatch.rendering.ranks import rank_verdict
from graphwatch.rendering.terminal import Summary
from graphwatch.rendering.wording import verdict

VERDICT = "graphwatch: nothing watched: no backward ran in this process"

SYNTAX_ERROR = "import torch\nfor step in range(3)\n    pass\n"

RAISES_BEFORE_ITS_LOOP = """\
    import torch
    model = torch.nn.Linear(4, 1)
    data = open("missing.csv").read()  # fails before any training
    for _ in range(3):
        model(torch.ones(2, 4)).sum().backward()
"""

TRAINS_IN_CHILDREN = """\
    import torch
    import torch.multiprocessing as mp
    from torch import nn


    def train(model):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            model(torch.ones(2, 4)).sum().backward()
            opt.step()


    if __name__ == "__main__":
        model = nn.Linear(4, 1)
        model.share_memory()
        workers = [mp.Process(target=train, args=(model,)) for _ in range(2)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        print("exit codes", [worker.exitcode for worker in workers])
"""


def graphwatch_run(folder: Path, script: str, *options: str) -> subprocess.CompletedProcess[str]:
    (folder / "train.py").write_text(textwrap.dedent(script))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NO_COLOR": "1", "COLUMNS": "400"}
    return warm_python.run(
        [sys.executable, "-m", "graphwatch", "run", "--no-progress", "--out", "out", *options, "train.py"],
        cwd=folder, capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip


@pytest.mark.parametrize("script", [SYNTAX_ERROR, RAISES_BEFORE_ITS_LOOP], ids=["syntax-error", "raises-before-loop"])
def test_a_script_that_fails_before_any_backward_says_nothing_was_watched(tmp_path: Path, script: str) -> None:
    done = graphwatch_run(tmp_path, script)
    assert done.returncode == 1, done.stderr  # the script's own error
    assert VERDICT in done.stderr and "no graph leaks" not in done.stderr, done.stderr
    assert "no backward ran before the run ended, so nothing was checked: fix the error" in done.stderr
    report = (tmp_path / "out" / "index.html").read_text()
    assert "nothing watched: no backward ran in this process" in report and "no graph leaks" not in report
    assert "so nothing was checked: fix the error and run it again" in report
    assert verdict([graphwatch.load(tmp_path / "out" / "trace.json")]) == (VERDICT, False)  # the trace says it


def test_training_only_in_child_processes_says_to_watch_each_worker_and_is_no_strict_failure(tmp_path: Path) -> None:
    done = graphwatch_run(tmp_path, TRAINS_IN_CHILDREN, "--strict")
    assert done.returncode == 0 and done.stdout == "exit codes [0, 0]\n", done.stderr
    assert VERDICT in done.stderr and "no graph leaks" not in done.stderr, done.stderr
    advice = "Training in processes it starts (torch.multiprocessing, mp.spawn) is not watched from here"
    assert advice in done.stderr and "torchrun" in done.stderr and "graphwatch.watch(out=...)" in done.stderr
    assert advice in (tmp_path / "out" / "index.html").read_text()


def forwards_only(steps: int, explicit: bool) -> graphwatch.Trace:
    """A loop of forwards only (an inference loop), its steps marked with ``end_step()`` or not."""
    model = torch.nn.Linear(4, 1)
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        for _ in range(steps):
            model(torch.ones(2, 4)).sum().item()
            if explicit:
                gw.end_step()
    return gw.trace


def summary_text(trace: graphwatch.Trace) -> str:
    console = Console(file=io.StringIO(), width=200)
    console.print(Summary(trace))
    return console.file.getvalue()  # type: ignore[attr-defined]


def test_forwards_in_steps_the_user_marks_are_watched_and_a_run_of_forwards_alone_is_not(no_session_left: None) -> None:
    marked, unmarked = forwards_only(3, explicit=True), forwards_only(3, explicit=False)
    assert summary_text(marked).splitlines()[0] == "graphwatch: no graph leaks in 3 steps"  # kept graphs looked for
    said = summary_text(unmarked)
    assert said.splitlines()[0] == VERDICT and "no backward ran in this process, so nothing was checked" in said


def test_ranks_that_ran_no_backward_say_nothing_was_watched_on_them(no_session_left: None) -> None:
    traces = [forwards_only(2, explicit=False) for _ in range(2)]
    for rank, trace in enumerate(traces):
        trace.rank, trace.world_size = rank, 2
    assert rank_verdict(traces) == ("graphwatch: nothing watched: no backward ran on 2 ranks", False)
