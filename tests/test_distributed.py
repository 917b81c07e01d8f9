"""graphwatch inside ``torch.distributed`` jobs: torchrun, DistributedDataParallel, gloo, two processes on this machine.

Two real jobs, each started once (module fixtures) with ``python -m torch.distributed.run
--nproc-per-node 2`` on the loopback interface, each rank's output kept in its own log file:

* ``leak_job``: ``-m graphwatch run --out OUT examples/distributed/ddp_rank_leak.py``, whose last
  rank (rank 1) adds the loss tensor to its running total: a graph kept on one rank only.
* ``clean_job``: the same training loop, fixed, in a script that trains each DDP variant (one
  bucket, many buckets, ``find_unused_parameters``, ``no_sync`` accumulation) bare and then
  under ``graphwatch.watch()``, and compares the parameters.

The rank logic itself (rank folders, rank-0 gathering, rank-only marks) is also tested in this
process with ``RANK``/``WORLD_SIZE`` set as torchrun sets them, which costs no launch.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import warm_python
from dot_calls import dot_that_keeps_its_input
from rich.console import Console

import graphwatch
from graphwatch import runner
from graphwatch.analysis.growth import live_counts_measured
from graphwatch.cli import main
from graphwatch.model import Finding, StepRecord, Trace, save_trace
from graphwatch.rendering.charts import SPARK_BLOCKS
from graphwatch.rendering.ranks import (
    RankRow,
    RankSummary,
    is_rank_set,
    rank_folder,
    rank_verdict,
    ranks_html,
    shared_findings,
    wait_for_ranks,
)

REPO = Path(graphwatch.__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "distributed" / "ddp_rank_leak.py"
JOB_TIMEOUT = 120  # seconds for one two-process job, launch included
STEPS = 4

_dist = torch.distributed
needs_gloo = pytest.mark.skipif(
    not (_dist.is_available() and _dist.is_gloo_available()), reason="torch.distributed with gloo is not available"
)

# Trains each DDP variant bare, then under graphwatch.watch(), with the example's (fixed) loop.
CLEAN_JOB = '''\
import gc, json, sys
from pathlib import Path
import torch
import torch.distributed as dist
import graphwatch

sys.path.insert(0, sys.argv[2])
from ddp_rank_leak import make_model, train

VARIANTS = {  # name: (make_model options, train options)
    "one bucket": ({"find_unused": False, "bucket_cap_mb": None}, {"accumulate": 1}),
    "many buckets": ({"find_unused": False}, {"accumulate": 1}),
    "find_unused_parameters": ({"find_unused": True, "bucket_cap_mb": None}, {"accumulate": 1}),
    "no_sync": ({}, {}),  # the example's own loop: small buckets, unused parameters, no_sync accumulation
}
out = Path(sys.argv[1])
dist.init_process_group("gloo")
rank = dist.get_rank()


def parameters(model_options, train_options):
    model, opt = make_model(**model_options)
    train(model, opt, rank, steps=int(sys.argv[3]), fixed=True, **train_options)
    return torch.cat([p.detach().flatten() for p in model.parameters()])


results = {}
for name, (model_options, train_options) in VARIANTS.items():
    last = name == "no_sync"
    bare = parameters(model_options, train_options)
    with graphwatch.watch(out=out / "report" if last else None, summary=last) as gw:
        watched = parameters(model_options, train_options)
    replicas = [torch.empty_like(watched) for _ in range(dist.get_world_size())]
    dist.all_gather(replicas, watched)
    results[name] = {
        "identical": torch.equal(bare, watched),
        "replicas_equal": all(torch.equal(replicas[0], r) for r in replicas),
        "findings": [f"{f.kind}: {f.message}" for f in gw.findings],
        "rank": gw.trace.rank,
        "world_size": gw.trace.world_size,
        "steps": len(gw.trace.steps),
    }
(out / f"result{rank}.json").write_text(json.dumps(results))
gc.collect()  # DDP models freed first: one still alive at destroy_process_group aborts gloo (torch 2.13, bare too)
dist.barrier()
dist.destroy_process_group()
'''


@dataclass
class Job:
    """A finished two-process job: its exit code, the launcher's output and each rank's own output."""

    returncode: int
    out: Path
    launcher: str
    stdout: dict[int, str]
    stderr: dict[int, str]

    def explain(self) -> str:
        logs = "".join(f"\n--- rank {r} stderr ---\n{text[-3000:]}" for r, text in self.stderr.items())
        return f"exit {self.returncode}\n--- launcher ---\n{self.launcher[-3000:]}{logs}"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def launch(tmp: Path, *command: str | Path) -> Job:
    """``python -m torch.distributed.run --nproc-per-node 2 COMMAND...`` on loopback, bounded by JOB_TIMEOUT.

    The launcher is forked off the warm server of :mod:`warm_python` (it imports torch, 3-4 s of CPU when cold); it
    starts each rank as torchrun does, a fresh interpreter of its own.
    """
    logs, out = tmp / "logs", tmp / "out"
    env = dict(os.environ, NO_COLOR="1", PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    if Path("/sys/class/net/lo").exists():
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    args = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
        "--master-port", str(_free_port()), "--log-dir", str(logs), "--redirects", "3", *map(str, command),
    ]

    def read(rank: int, stream: str) -> str:
        return "".join(p.read_text(errors="replace") for p in logs.glob(f"*/attempt_*/{rank}/{stream}.log"))

    try:
        done = warm_python.run(args, cwd=tmp, env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired:  # (the launcher is killed; its output is lost, each rank's log is kept)
        ranks = Job(-9, out, "", {}, {r: read(r, "stderr") for r in (0, 1)})
        pytest.fail(f"the two-process job did not finish in {JOB_TIMEOUT} s:\n{ranks.explain()}")
    stdout, stderr = ({r: read(r, stream) for r in (0, 1)} for stream in ("stdout", "stderr"))
    return Job(done.returncode, out, done.stdout + done.stderr, stdout, stderr)


@pytest.fixture(scope="module")
def leak_job(tmp_path_factory: pytest.TempPathFactory) -> Job:
    tmp = tmp_path_factory.mktemp("leak-job")
    job = launch(tmp, "-m", "graphwatch", "run", "--out", tmp / "out", EXAMPLE, "--steps", str(STEPS))
    assert job.returncode == 0, job.explain()
    return job


@pytest.fixture(scope="module")
def clean_job(tmp_path_factory: pytest.TempPathFactory) -> Job:
    tmp = tmp_path_factory.mktemp("clean-job")
    (tmp / "out").mkdir()
    (tmp / "clean_job.py").write_text(CLEAN_JOB)
    job = launch(tmp, tmp / "clean_job.py", tmp / "out", EXAMPLE.parent, str(STEPS))
    assert job.returncode == 0, job.explain()
    return job


def _kept_line() -> str:
    lines = EXAMPLE.read_text().splitlines()
    number = next(i for i, line in enumerate(lines, 1) if "# graphwatch: kept" in line)
    return f"ddp_rank_leak.py:{number}"


# ------------------------------------------------------------------------ graphwatch run under torchrun
@needs_gloo
def test_each_rank_writes_its_own_report_with_rank_and_world_size(leak_job: Job) -> None:
    for rank in (0, 1):
        folder = leak_job.out / f"rank{rank}"
        assert (folder / "index.html").is_file() and (folder / "trace.json").is_file()
        trace = graphwatch.load(folder / "trace.json")
        assert (trace.rank, trace.world_size) == (rank, 2)
        assert len(trace.steps) >= STEPS
    assert not (leak_job.out / "trace.json").exists()  # no rank wrote the shared folder's own trace
    assert (leak_job.out / "index.html").is_file()  # rank 0's report of both ranks
    assert leak_job.stdout[1].startswith("rank 1: mean loss")  # the script's output and exit code are kept


@needs_gloo
def test_the_leak_is_found_on_rank_1_only(leak_job: Job) -> None:
    rank0, rank1 = (graphwatch.load(leak_job.out / f"rank{r}" / "trace.json") for r in (0, 1))
    assert rank0.findings == []
    kept = [f for f in rank1.findings if f.kind == "graph-kept-alive"]
    assert kept and any(site.endswith(_kept_line()) for site in kept[0].evidence["sites"])


@needs_gloo
def test_rank_0_prints_the_summary_of_both_ranks_and_rank_1_prints_none(leak_job: Job) -> None:
    summary = leak_job.stderr[0]
    assert re.search(r"graphwatch: \d+ problems? in 2 ranks, \d+ steps each \(only on rank 1\)", summary), summary
    assert re.search(r"graph-kept-alive\s+only on rank 1", summary)
    assert f"report: {leak_job.out / 'index.html'}" in summary
    assert "graphwatch" not in leak_job.stderr[1] and "graphwatch" not in leak_job.stdout[1]


@needs_gloo
def test_report_of_rank_traces_marks_rank_only_findings(
    leak_job: Job, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    traces = [leak_job.out / f"rank{r}" / "trace.json" for r in (1, 0)]  # any order: columns go by rank
    assert main(["report", *map(str, traces), "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "(only on rank 1)" in printed.splitlines()[0]
    assert re.search(r"graph-kept-alive\s+only on rank 1", printed)
    page = (tmp_path / "index.html").read_text()
    assert "Across ranks" in page and '<span class="ranks">only on rank 1</span>' in page
    assert page.index('id="0-rank-0"') < page.index('id="1-rank-1"')
    assert "<th>rank 0</th><th>rank 1</th>" in page  # a column per rank in the per-step table


# ---------------------------------------------------------------------- DDP with and without graphwatch
@needs_gloo
def test_ddp_gradients_are_identical_under_graphwatch_and_a_clean_loop_has_no_findings(clean_job: Job) -> None:
    for rank in (0, 1):
        results = json.loads((clean_job.out / f"result{rank}.json").read_text())
        assert set(results) == {"one bucket", "many buckets", "find_unused_parameters", "no_sync"}
        for variant, result in results.items():
            assert result["identical"], f"rank {rank}, {variant}: parameters differ under graphwatch"
            assert result["replicas_equal"], f"rank {rank}, {variant}: DDP replicas diverged"
            assert result["findings"] == [], f"rank {rank}, {variant}: {result['findings']}"
            assert (result["rank"], result["world_size"], result["steps"] >= STEPS) == (rank, 2, True)


@needs_gloo
def test_watch_under_torchrun_writes_a_folder_per_rank_and_rank_0_prints(clean_job: Job) -> None:
    for rank in (0, 1):
        trace = graphwatch.load(clean_job.out / "report" / f"rank{rank}" / "trace.json")
        assert (trace.rank, trace.world_size, trace.findings) == (rank, 2, [])
    printed = " ".join(clean_job.stderr[0].split())  # the summary wraps long lines
    assert "graphwatch: no graph leaks in" in printed and "(rank 0 of 2)" in printed
    # (the summary names the report folder from the folder the job started in, tmp: out/report)
    assert f"graphwatch report {Path('out', 'report')}/rank*/trace.json --out {Path('out', 'report')}" in printed
    assert "graphwatch" not in clean_job.stderr[1]


# -------------------------------------------------------------- rank logic, in this process (no launch)
RANK_SCRIPT = """\
import sys
import torch
from graphwatch.model import Finding, StepRecord, Trace, save_trace

w = torch.ones(3, requires_grad=True)
opt = torch.optim.SGD([w], lr=0.1)
for _ in range(3):
    opt.zero_grad(); (w * w).sum().backward(); opt.step()
if len(sys.argv) > 1:  # play rank 1 of the job, finishing while rank 0 runs
    leak = Finding("graph-kept-alive", "warning", 1, "kept", "use .item()", {"sites": ["train.py:9"]})
    steps = [StepRecord(index=i, source="optimizer", live_nodes=4 * i) for i in range(3)]
    save_trace(Trace(rank=1, world_size=2, steps=steps, findings=[leak]), sys.argv[1])
sys.exit(5)
"""


def _as_rank(monkeypatch: pytest.MonkeyPatch, rank: int) -> None:
    for name, value in {"RANK": rank, "WORLD_SIZE": 2, "LOCAL_RANK": rank, "LOCAL_WORLD_SIZE": 2}.items():
        monkeypatch.setenv(name, str(value))


def test_rank_1_writes_its_folder_keeps_its_exit_code_and_prints_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _as_rank(monkeypatch, 1)
    (tmp_path / "train.py").write_text(RANK_SCRIPT)
    assert main(["run", "--out", str(tmp_path / "out"), str(tmp_path / "train.py")]) == 5
    assert graphwatch.load(tmp_path / "out" / "rank1" / "trace.json").rank == 1
    assert not (tmp_path / "out" / "index.html").exists()
    assert capsys.readouterr().err == ""


def test_rank_0_gathers_the_ranks_written_during_its_run_and_ignores_stale_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _as_rank(monkeypatch, 0)
    monkeypatch.setattr(runner, "RANK_WAIT_SECONDS", 0.3)
    (tmp_path / "train.py").write_text(RANK_SCRIPT)
    rank1 = tmp_path / "out" / "rank1" / "trace.json"
    rank1.parent.mkdir(parents=True)
    save_trace(Trace(rank=1, world_size=2), rank1)
    os.utime(rank1, (0, 0))  # a previous job's trace
    assert main(["run", "--out", str(tmp_path / "out"), str(tmp_path / "train.py")]) == 5
    err = capsys.readouterr().err
    assert "no trace from rank(s) 1" in err and "(rank 0 of 2)" in err and not (tmp_path / "out" / "index.html").exists()

    assert main(["run", "--out", str(tmp_path / "out"), str(tmp_path / "train.py"), str(rank1)]) == 5
    err = capsys.readouterr().err
    assert "graphwatch: 1 problem in 2 ranks, 3 steps each (only on rank 1)" in err
    assert re.search(r"graph-kept-alive\s+only on rank 1", err)
    assert "only on rank 1" in (tmp_path / "out" / "index.html").read_text()


# As a rank, a short loop; as rank 0 (with two arguments), rank 1's trace arrives while it runs.
TWIN_SCRIPT = """\
import shutil, sys
import torch

w = torch.ones(3, requires_grad=True)
opt = torch.optim.SGD([w], lr=0.1)
for _ in range(3):
    opt.zero_grad(); (w * w).sum().backward(); opt.step()
if len(sys.argv) > 2:
    shutil.copy(sys.argv[1], sys.argv[2])
"""


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_rank_0_lays_out_each_graph_once_for_its_own_report_and_the_joint_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 writes its own report, then the job's with every rank: a graph it laid out for its own, or the same
    graph of another rank, goes to ``dot`` once (counted by a ``dot`` first on the PATH that keeps what it is
    given, :mod:`dot_calls`)."""
    path, laid_out = dot_that_keeps_its_input(tmp_path)
    monkeypatch.setenv("PATH", path)
    monkeypatch.setattr(runner, "RANK_WAIT_SECONDS", 5)
    (tmp_path / "train.py").write_text(TWIN_SCRIPT)
    out, rank1 = tmp_path / "out", tmp_path / "rank1.json"
    _as_rank(monkeypatch, 1)
    assert main(["run", "--quiet", "--out", str(out), str(tmp_path / "train.py")]) == 0
    (out / "rank1" / "trace.json").rename(rank1)
    before = sum(map(len, laid_out().values()))

    _as_rank(monkeypatch, 0)
    script = [str(tmp_path / "train.py"), str(rank1), str(out / "rank1" / "trace.json")]
    assert main(["run", "--quiet", "--out", str(out), *script]) == 0
    traces = [graphwatch.load(out / f"rank{r}" / "trace.json") for r in (0, 1)]
    graphs = {graph for trace in traces for snap in trace.snapshots for graph in (snap.dot, snap.focus) if graph}
    assert graphs and sum(map(len, laid_out().values())) - before == len(graphs)
    page = (out / "index.html").read_text()
    assert page.count("<svg") == 2 * (out / "rank0" / "index.html").read_text().count("<svg") > 0


def _trace(rank: int, *findings: Finding, steps: int = 3) -> Trace:
    return Trace(
        rank=rank, world_size=3, findings=list(findings),
        steps=[StepRecord(index=i, source="optimizer", live_nodes=rank + i) for i in range(steps)],
    )


def test_a_problem_on_every_rank_is_counted_once_and_not_marked() -> None:
    def leak(step: int) -> Finding:  # steps and messages differ from rank to rank; kind and line match
        return Finding("graph-kept-alive", "warning", step, f"kept at {step}", "f", {"sites": ["t.py:4"]})

    retained = Finding("retained-graph", "warning", 0, "m", "f", {"sites": ["t.py:9"]})
    traces = [_trace(0, leak(1)), _trace(1, leak(2), retained), _trace(2, leak(1))]
    shared = shared_findings(traces)
    assert [(s.finding.kind, s.ranks, s.note) for s in shared] == [
        ("graph-kept-alive", (0, 1, 2), ""), ("retained-graph", (1,), "only on rank 1"),
    ]
    assert rank_verdict(traces) == ("graphwatch: 2 problems in 3 ranks, 3 steps each", False)
    console = Console(file=io.StringIO(), width=100)
    console.print(RankSummary(traces[:2]))
    text = console.file.getvalue()
    assert "no trace of rank 2 (of 3)" in text and re.search(r"retained-graph\s+only on rank 1", text)


def _healthy_rank(rank: int, level: str) -> Trace:
    """A real healthy loop of 40 steps watched at ``level``, its trace marked as rank ``rank`` of 2."""
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with graphwatch.watch(level=level, summary=False, snapshots="off") as gw:
        for _ in range(40):
            opt.zero_grad()
            model(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step()
    return dataclasses.replace(gw.trace, rank=rank, world_size=2)


def test_the_rank_summary_shows_live_counts_of_steps_seen_light_as_not_measured(tmp_path: Path) -> None:
    """At the default level a step seen light measured no live saved bytes or nodes alive: the rank table, its
    sparkline and the report's per-step, per-rank table show "–" and a gap there, never a 0 or a value."""
    default, light = _healthy_rank(0, "default"), _healthy_rank(1, "light")
    measured = live_counts_measured(default)
    light_steps = [s.index for s in default.steps if not measured(s.index)]
    assert light_steps and any(measured(s.index) for s in default.steps)
    rows = {row.rank: row for row in map(RankRow.of, (default, light))}
    assert rows[0].peak_nodes is not None and rows[1].peak_nodes is None and rows[1].peak_saved is None
    assert rows[0].cells()[3:5] != ["–", "–"] and rows[1].cells()[3:5] == ["–", "–"]
    console = Console(file=io.StringIO(), width=120)  # (a sparkline 40 wide: a character per step)
    console.print(RankSummary([default, light]))
    lines = {line.split()[0]: line for line in console.file.getvalue().splitlines() if re.match(r"\s+[01]\s", line)}
    drawn = [sum(char in SPARK_BLOCKS for char in lines[rank]) for rank in ("0", "1")]
    assert drawn == [len(default.steps) - len(light_steps), 0]  # a gap (SPARK_GAP) for each step seen light
    html = ranks_html([default, light], ["rank0", "rank1"])
    step = light_steps[-1]
    row = re.search(rf"<tr><td>{step}</td>(.*?)</tr>", html)
    assert row is not None and re.findall(r"<td>(.*?)</td>", row[1]) == ["–", "–", "–", "–", ""]


def test_rank_sets_and_rank_folders(tmp_path: Path) -> None:
    assert is_rank_set([_trace(0), _trace(2)])
    assert not is_rank_set([_trace(0)])  # one trace
    assert not is_rank_set([_trace(1), _trace(1)])  # the same rank of two jobs
    assert not is_rank_set([Trace(), Trace()])  # single-process runs
    assert not is_rank_set([_trace(0), Trace(rank=1, world_size=4)])  # two jobs
    assert rank_folder(tmp_path, _trace(2)) == tmp_path / "rank2" and rank_folder(tmp_path, Trace()) == tmp_path
    assert wait_for_ranks(tmp_path, 3, since=0, timeout=5, stop=lambda: True) == {}
