"""Hostile traces that claim more than they hold, and runs that must stay the user's (issue 27).

Memory is measured as the peak RSS of a real ``graphwatch report`` process
(``ru_maxrss``, a bound: never a timing).  The runs are real subprocesses:
``-W error``, a pipe whose reader has gone, an ASCII locale, SIGTERM, a report
folder that disappears mid-run, each compared with the same script run bare.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import warm_python
from warm_child import SAY_READY, InBackground, run_and_signal, standard_streams

import graphwatch
from graphwatch.model import BackwardRecord, StepRecord, Trace, trace_to_dict
from graphwatch.model.column_json import BASE_RECORDS

REPO = Path(graphwatch.__file__).resolve().parents[2]
TIMEOUT = 300
MB = 2**20
FIXED_BASE = 32 * MB  # what a report may take beyond a tiny trace's, whatever the file (the issue: <= 50x + a base)


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "NO_COLOR": "1", **extra}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def _script(folder: Path, text: str, name: str = "train.py") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess[str]:
    return warm_python.run([sys.executable, *args], cwd=cwd, env=env or _env(), capture_output=True, text=True,
                          timeout=TIMEOUT, **kwargs)  # fmt: skip


# ---------------------------------------------------------------------------- memory bombs
PEAK = """\
import resource, sys
from graphwatch.cli import main
code = main(["report", "-q", sys.argv[1], "--out", sys.argv[2]])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, code)
"""


def _peak_and_exit_code(trace: Path, folder: Path) -> tuple[int, int, str]:
    done = _run([str(_script(folder, PEAK, "peak.py")), str(trace), str(folder / f"out-{trace.stem}")], folder)
    peak, code = done.stdout.split()[-2:]
    return int(peak), int(code), done.stderr


def _small_trace() -> dict:
    steps = [StepRecord(index=i, source="optimizer", seconds=0.1 * i, backwards=[i], detail=False) for i in range(3)]
    backwards = [BackwardRecord(id=i, step=i, site=None, api="backward", retain_graph=False, create_graph=False,
                                seconds=0.01 * i) for i in range(3)]  # fmt: skip
    return trace_to_dict(Trace(steps=steps, backwards=backwards))


def _claiming(records: int, *, detail: bool = False, every_backward: bool = False, listed: list | None = None) -> dict:
    """The small trace, its steps and backwards claiming ``records`` records in compact columns."""
    data = _small_trace()
    for table, key in (("steps", "index"), ("backwards", "id")):
        columns = data[table]["columns"]
        data[table]["count"], data[table]["extra"] = records, []
        for name, column in columns.items():
            first = column[0] if isinstance(column, list) else next(iter(column.values()))
            columns[name] = {"from": 0} if name in (key, "step", "backwards.first") else {"all": first}
    steps = data["steps"]["columns"]
    steps["backwards.count"] = {"all": records if every_backward else 1}
    if every_backward:
        steps["backwards.first"] = {"all": 0}
    if detail:
        steps["detail"] = {"all": True}
    if listed is not None:  # a column that holds only these values
        steps["seconds"] = listed
        data["backwards"]["count"] = 3
        data["backwards"]["columns"] = _small_trace()["backwards"]["columns"]
        steps["backwards.first"], steps["backwards.count"] = {"all": 0}, {"all": 0}
    return data


BOMBS = {
    # the two: a 78 KB file whose step columns claim 10^7 records but hold two values; 3 KB claiming 10^7
    "78kb-two-values": lambda: {**_claiming(10**7, listed=[0.5, 0.25]), "options": {"padding": "x" * 78_000}},
    "3kb-compact": lambda: {**_claiming(10**7), "options": {"padding": "x" * 1500}},
    "detail-everywhere": lambda: _claiming(BASE_RECORDS, detail=True),
    "each-step-every-backward": lambda: _claiming(BASE_RECORDS, every_backward=True),
    "detail-record-by-record": lambda: _record_by_record(_claiming(BASE_RECORDS, detail=True)),
}


def _record_by_record(data: dict) -> dict:
    """Columns that are not the layout graphwatch writes (a field's own column): read record by record."""
    data["steps"]["columns"]["holders"] = {"all": []}
    return data


@pytest.fixture(scope="module")
def small_peak(tmp_path_factory) -> int:
    folder = tmp_path_factory.mktemp("small")
    (folder / "small.json").write_text(json.dumps(_small_trace()))
    peak, code, err = _peak_and_exit_code(folder / "small.json", folder)
    assert code == 0, err
    return peak


@pytest.mark.parametrize("bomb", list(BOMBS))
def test_a_trace_claiming_more_than_it_holds_is_refused_in_memory_proportional_to_the_file(bomb, small_peak, tmp_path):
    path = tmp_path / f"{bomb}.json"
    path.write_text(json.dumps(BOMBS[bomb]()))
    size = path.stat().st_size
    peak, code, err = _peak_and_exit_code(path, tmp_path)
    assert code == 2 and "the trace file is damaged" in err and "Traceback" not in err, err
    assert peak - small_peak <= 50 * size + FIXED_BASE, (peak - small_peak) / MB


def test_the_most_a_small_file_may_claim_is_rendered_in_bounded_memory(small_peak, tmp_path):
    path = tmp_path / "at-the-bound.json"
    path.write_text(json.dumps(_claiming(BASE_RECORDS)))
    peak, code, err = _peak_and_exit_code(path, tmp_path)
    assert code == 0, err
    assert graphwatch.load(path).steps[BASE_RECORDS - 1].index == BASE_RECORDS - 1
    assert peak - small_peak <= 50 * path.stat().st_size + FIXED_BASE, (peak - small_peak) / MB


def test_a_long_real_shaped_trace_loads_in_memory_proportional_to_its_file(small_peak, tmp_path):
    n = 100_000
    steps = [StepRecord(index=i, source="optimizer", seconds=(i % 97) / 97, rss_bytes=2**28 + 4096 * (i % 13),
                        live_nodes=i % 7, backwards=[i], detail=False) for i in range(n)]  # fmt: skip
    backwards = [BackwardRecord(id=i, step=i, site=None, api="backward", retain_graph=False, create_graph=False,
                                seconds=(i % 89) / 890) for i in range(n)]  # fmt: skip
    path = tmp_path / "long.json"
    path.write_text(json.dumps(trace_to_dict(Trace(steps=steps, backwards=backwards))))
    peak, code, err = _peak_and_exit_code(path, tmp_path)
    assert code == 0, err
    assert peak - small_peak <= 50 * path.stat().st_size + FIXED_BASE, (peak - small_peak) / MB


def test_a_trace_without_its_steps_is_damaged_not_empty(tmp_path, capsys):
    data = _small_trace()
    del data["steps"]
    (tmp_path / "no-steps.json").write_text(json.dumps(data))
    from graphwatch.cli import main

    assert main(["report", str(tmp_path / "no-steps.json"), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "no-steps.json has no 'steps' field; the trace file is damaged - record the run again"
    )
    assert not (tmp_path / "out" / "index.html").exists()


# --------------------------------------------------------------------------------- -W error
# three steps of a tiny training loop, as the scripts below run it
THREE_STEPS = """\
import torch
w = torch.ones(3, requires_grad=True)
opt = torch.optim.SGD([w], lr=0.1)
def train(steps=3):
    for _ in range(steps):
        opt.zero_grad(); (w * w).exp().sum().backward(); opt.step()
"""
UNWRITABLE_AND_FAILING = THREE_STEPS + """\
import pathlib, shutil, graphwatch
with graphwatch.watch(out="out", summary=False):
    train()
    shutil.rmtree("out", ignore_errors=True)
    pathlib.Path("out").write_text("a file where the report folder was")
    {}["the user's own key"]
"""


def test_under_w_error_the_users_exception_wins_over_an_unwritable_report(tmp_path):
    done = _run(["-W", "error", str(_script(tmp_path, UNWRITABLE_AND_FAILING))], tmp_path,
                env=_env(PYTHONWARNINGS="error"))  # fmt: skip
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == "KeyError: \"the user's own key\"", done.stderr[-3000:]
    assert "UserWarning" not in done.stderr
    notice = next(line for line in done.stderr.splitlines() if line.startswith("graphwatch: cannot write the report"))
    kept = Path(notice.split("the trace was saved to ")[1].split(" instead")[0])
    assert len(graphwatch.load(kept).steps) >= 3  # the trace is not lost with its folder
    kept.unlink()


def test_a_report_folder_that_goes_away_mid_run_keeps_the_trace_in_a_file_named_on_stderr(tmp_path):
    script = _script(tmp_path, UNWRITABLE_AND_FAILING.replace('{}["the user\'s own key"]', "pass"))
    done = _run([str(script)], tmp_path)
    # (the folder is resolved when the session starts: the error names it whole)
    assert done.returncode == 1 and f"graphwatch.errors.UsageError: cannot write the report to {tmp_path / 'out'}:" in done.stderr
    kept = Path(done.stderr.split("the trace was saved to ")[1].split(" instead")[0])
    assert len(graphwatch.load(kept).steps) >= 3
    kept.unlink()


# ------------------------------------------------------------------------------ closed pipes
WAITS_FOR_THE_READER_TO_GO = THREE_STEPS + """\
import os, sys, time
train()
print("line one", flush=True)
for _ in range(600):  # until the reader has read its line and gone (`| head -1`)
    if os.path.exists("reader-gone"):
        break
    time.sleep(0.05)
sys.exit(5)
"""


@pytest.mark.parametrize("how", ["bare", "watched"])
@pytest.mark.parametrize("streams", ["stdout and stderr", "stdout"])
def test_a_reader_that_goes_away_keeps_the_scripts_exit_code(tmp_path, how, streams):
    """``graphwatch run train.py 2>&1 | head -1``: the summary meets a closed pipe; the exit code stays 5."""
    script = _script(tmp_path, WAITS_FOR_THE_READER_TO_GO)
    args = [str(script)] if how == "bare" else ["-m", "graphwatch", "run", "--out", "out", str(script)]
    (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
    with standard_streams(out_w, out_w if streams == "stdout and stderr" else err_w, _env()):
        os.close(out_w)
        os.close(err_w)
        child = InBackground([sys.executable, *args], cwd=tmp_path, env=_env(), timeout=TIMEOUT)
        with os.fdopen(out_r, "rb") as reader:
            while not select.select([reader], [], [], 0.1)[0]:  # (this process holds the pipe open too)
                assert child.running(), f"the script wrote no line: {child.result(TIMEOUT)}"
            assert reader.readline() == b"line one\n"
        # (closed: `head -1` has its line and exits)
        (tmp_path / "reader-gone").touch()
        assert child.result(TIMEOUT).returncode == 5
    with os.fdopen(err_r, "rb") as errors:  # (all the child wrote there, this process's stderr given back)
        err = errors.read().decode()
    if streams == "stdout":
        assert "Traceback" not in err and "Exception ignored" not in err, err
    if how == "watched":
        assert (tmp_path / "out" / "trace.json").is_file()


# -------------------------------------------------------------------------------- the locale
ASCII = {"LANG": "C", "LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}
KEEPS_EVERY_GRAPH = """\
    import torch
    w = torch.ones(3, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    total = 0
    for _ in range(6):
        opt.zero_grad()
        loss = (w * w).exp().sum()
        loss.backward()
        total += loss  # keeps every graph
        opt.step()
    print("done")
"""


def test_an_ascii_locale_and_a_non_ascii_script_name_give_the_report(tmp_path):
    script = _script(tmp_path, KEEPS_EVERY_GRAPH, "trän_ü.py")
    bare = _run([str(script)], tmp_path, env=_env(**ASCII))
    watched = _run(["-m", "graphwatch", "run", "--out", "out", str(script)], tmp_path, env=_env(**ASCII))
    assert (watched.returncode, watched.stdout) == (bare.returncode, bare.stdout) == (0, "done\n"), watched.stderr
    assert "Traceback" not in watched.stderr
    page = (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    assert "trän_ü.py:9" in page and 'class="source"' in page  # the name as it is, its lines from the trace
    if list((tmp_path / "out" / "snapshots").glob("*.svg")):
        assert "could not render" not in page


def test_an_ascii_locale_renders_a_trace_citing_non_ascii_files(tmp_path):
    script = _script(tmp_path, KEEPS_EVERY_GRAPH, "trän_ü.py")
    assert _run(["-m", "graphwatch", "run", "--out", "recorded", str(script)], tmp_path).returncode == 0
    done = _run(["-m", "graphwatch", "report", "recorded/trace.json", "--out", "out"], tmp_path, env=_env(**ASCII))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "report: out/index.html" in done.stdout
    assert "trän_ü.py:9" in (tmp_path / "out" / "index.html").read_text(encoding="utf-8")


# ------------------------------------------------------------------------------- SIGTERM
STOPPED = """\
    import os, signal, sys, threading, torch{watch}
    w = torch.ones(3, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    with {context}:
        for i in range(10**7):
            opt.zero_grad(); (w * w).exp().sum().backward(); opt.step()
            if i == 3:
                {ready}
    print("never")
"""


@pytest.mark.parametrize("how", ["bare", "watched"])
def test_watch_out_stopped_by_sigterm_writes_the_summary_and_the_report_then_ends_as_sigterm_would(tmp_path, how):
    watched = how == "watched"
    script = _script(tmp_path, STOPPED.format(
        watch=", graphwatch" if watched else "", context="graphwatch.watch(out='out')" if watched else "open(__file__)",
        ready=SAY_READY,
    ))  # fmt: skip
    done = run_and_signal([sys.executable, str(script)], signal.SIGTERM, cwd=tmp_path, env=_env(), timeout=TIMEOUT)
    out, err = done.stdout, done.stderr
    assert done.returncode == -signal.SIGTERM and "never" not in out
    if watched:
        assert "graphwatch: " in err and "the run ended early: Terminated: received SIGTERM" in err  # the summary
        assert graphwatch.load(tmp_path / "out" / "trace.json").ended_early == "Terminated: received SIGTERM"
        assert (tmp_path / "out" / "index.html").is_file()
        assert "Traceback" not in err


# ------------------------------------------------------------------------------ sys.exit(n)
def test_sys_exit_is_the_scripts_own_end_not_an_early_one(tmp_path):
    script = _script(tmp_path, KEEPS_EVERY_GRAPH.replace('print("done")', "raise SystemExit(7)"))
    done = _run(["-m", "graphwatch", "run", "--out", "out", str(script)], tmp_path)
    assert done.returncode == 7
    assert "the script ended itself with sys.exit(7)" in done.stderr and "ended early" not in done.stderr
    page = (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    assert "The script ended itself with sys.exit(7)" in page and "ended early" not in page


def test_sigterm_ends_a_watched_run_no_sooner_than_its_report(tmp_path):
    """A SIGTERM while the report is being written waits for it: the process still ends by SIGTERM."""
    script = _script(tmp_path, """\
        import os, signal, torch, graphwatch
        from graphwatch.rendering import html
        write = html.write_report
        def slow_write(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGTERM)  # arrives while the report is written
            return write(*args, **kwargs)
        html.write_report = slow_write
        w = torch.ones(3, requires_grad=True)
        opt = torch.optim.SGD([w], lr=0.1)
        with graphwatch.watch(out="out", summary=False):
            for _ in range(3):
                opt.zero_grad(); (w * w).exp().sum().backward(); opt.step()
        print("after the block")
    """)
    done = _run([str(script)], tmp_path)
    assert done.returncode == -signal.SIGTERM and "after the block" not in done.stdout, done.stderr
    assert (tmp_path / "out" / "index.html").is_file()
