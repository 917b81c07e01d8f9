"""The ``graphwatch`` command, run as a real subprocess (``python -m graphwatch``) on tiny training scripts."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import warm_python
from rich.console import Console
from warm_child import SAY_READY, InBackground, run_and_signal, standard_streams

import graphwatch
from graphwatch.cli import main, trace_labels
from graphwatch.command_line import RUN_VALUE_OPTIONS, build_parser, split_script_args
from graphwatch.demo import find_examples, run_demo
from graphwatch.runner import check_out_dir, check_script, exit_code_of, run_script

PACKAGE = Path(graphwatch.__file__).resolve().parent  # graphwatch's own files
REPO = PACKAGE.parents[1]  # the repository (the package lives in its src/)
TIMEOUT = 180

LOOP = """\
import sys
import torch

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
total_loss = 0
for step in range({steps}):
    opt.zero_grad()
    loss = model(torch.randn(16, 8)).pow(2).mean()
    loss.backward()
    opt.step()
    total_loss += {accumulate}
"""
CLEAN = LOOP.format(steps=6, accumulate="loss.item()")
LEAKING = LOOP.format(steps=8, accumulate="loss")  # keeps every step's graph alive


def gw(*args: str | Path, cwd: Path, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    """``python -m graphwatch ARGS`` with the repository on PYTHONPATH (no install needed)."""
    return warm_python.run(
        [sys.executable, "-m", "graphwatch", *map(str, args)],
        cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout,
    )


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONWARNINGS="ignore", NO_COLOR="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def script(tmp_path: Path, text: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def read_trace(out: Path) -> dict:
    assert (out / "index.html").is_file()
    return json.loads((out / "trace.json").read_text())


# ----------------------------------------------------------------------------- run
def test_run_keeps_output_exit_code_argv_and_sys_path(tmp_path: Path) -> None:
    (tmp_path / "helper.py").write_text("GREETING = 'hello from a sibling module'\n")
    train = script(tmp_path, CLEAN + "import helper\nprint(helper.GREETING, __name__, sys.argv)\nsys.exit(7)\n")
    result = gw("run", "--out", tmp_path / "out", train, "--lr", "0.1", "--", "-q", cwd=tmp_path)
    assert result.returncode == 7, result.stderr
    assert result.stdout == f"hello from a sibling module __main__ {[str(train), '--lr', '0.1', '--', '-q']}\n"
    assert "graphwatch: no graph leaks in 6 steps" in result.stderr  # the summary goes to stderr
    trace = read_trace(tmp_path / "out")
    assert trace["steps"]["count"] == 6 and trace["findings"] == []
    assert trace["ended_early"] == "SystemExit: 7"


def test_run_clean_script_passes_strict(tmp_path: Path) -> None:
    result = gw("run", "--strict", "--out", tmp_path / "out", script(tmp_path, CLEAN), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert read_trace(tmp_path / "out")["ended_early"] is None


def test_run_strict_fails_on_a_leak_and_plain_run_does_not(tmp_path: Path) -> None:
    train = script(tmp_path, LEAKING)
    strict = gw("run", "--strict", "--out", tmp_path / "strict", train, cwd=tmp_path)
    assert strict.returncode == 3, strict.stderr
    assert "--strict" in strict.stderr and "graph-kept-alive" in strict.stderr
    kinds = {f["kind"] for f in read_trace(tmp_path / "strict")["findings"]}
    assert "graph-kept-alive" in kinds
    plain = gw("run", "--quiet", "--out", tmp_path / "plain", train, cwd=tmp_path)
    assert plain.returncode == 0 and plain.stderr == "", plain.stderr


def test_run_uncaught_exception_prints_the_traceback_and_writes_the_report(tmp_path: Path) -> None:
    train = script(tmp_path, CLEAN + "def fail():\n    raise ValueError('boom')\nfail()\n")
    result = gw("run", "--out", tmp_path / "out", train, cwd=tmp_path)
    assert result.returncode == 1
    assert "Traceback (most recent call last):" in result.stderr
    assert f'File "{train}", line' in result.stderr and "ValueError: boom" in result.stderr
    assert "runner.py" not in result.stderr and "runpy" not in result.stderr  # only the script's frames
    assert read_trace(tmp_path / "out")["ended_early"] == "ValueError: boom"


@pytest.mark.parametrize(
    "signum, code, ended_early",
    [(signal.SIGTERM, 143, "Terminated: received SIGTERM"), (signal.SIGINT, 130, "KeyboardInterrupt")],
)
def test_run_stopped_by_a_signal_writes_the_report_marked_ended_early(
    tmp_path: Path, signum: int, code: int, ended_early: str
) -> None:
    # No sleep: the signal lands anywhere, often inside graphwatch's hooks or a __del__ (where
    # a raised exception would be dropped); the run must stop all the same.
    train = script(tmp_path, f"""\
        import torch

        model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(1_000_000):
            opt.zero_grad()
            model(torch.randn(8, 32)).pow(2).mean().backward()
            opt.step()
            if step == 3:
                {SAY_READY}
        """)
    out = tmp_path / "out"
    done = run_and_signal([sys.executable, "-m", "graphwatch", "run", "--out", str(out), str(train)], signum,
                          cwd=tmp_path, env=_env(), timeout=TIMEOUT)  # fmt: skip
    stderr = done.stderr
    assert done.returncode == code, stderr
    assert "Exception ignored" not in stderr
    if signum == signal.SIGTERM:
        assert "stopped by SIGTERM" in stderr and "Traceback" not in stderr
    else:
        assert stderr.startswith("Traceback (most recent call last):") and "KeyboardInterrupt" in stderr
    trace = read_trace(out)
    assert trace["ended_early"] == ended_early and trace["steps"]["count"] >= 4


def test_run_user_errors_are_one_line_exit_2(tmp_path: Path) -> None:
    missing = gw("run", "no_such_train.py", cwd=tmp_path)
    assert missing.returncode == 2
    assert missing.stderr.strip() == (
        "graphwatch: error: no such script: no_such_train.py; give the path of a Python file, "
        "e.g. `graphwatch run train.py`"
    )
    (tmp_path / "a_file").write_text("")
    train = script(tmp_path, "print('the script ran')\n")
    unwritable = gw("run", "--out", tmp_path / "a_file" / "report", train, cwd=tmp_path)
    assert unwritable.returncode == 2 and unwritable.stdout == ""  # checked before the script runs
    assert unwritable.stderr.startswith("graphwatch: error: cannot write the report to")
    assert "Traceback" not in unwritable.stderr and len(unwritable.stderr.strip().splitlines()) == 1


SLOW = """\
import time
import torch

w = torch.ones(4, requires_grad=True)
opt = torch.optim.SGD([w], lr=0.1)
kept = []
for step in range(10):
    opt.zero_grad()
    y = (w * w).sum()
    y.backward()
    opt.step()
    kept.append(y)
    print(f"script line {step}", flush=True)
    time.sleep(0.2)
"""


def run_on_terminal(args: list[str], cwd: Path, stdout_too: bool) -> tuple[int, str, str]:
    """Run ``graphwatch ARGS`` with stderr (and stdout, if ``stdout_too``) on a pseudo-terminal.

    Returns the exit code, what went to a stdout pipe (empty if on the terminal) and what the terminal showed.
    The run is forked off the warm server (tests/warm_python.py) with this process's standard streams, as
    :func:`subprocess.run` gives a child that captures nothing: for the run, they are the terminal and the pipe.
    """
    import pty
    import select

    env = dict(_env(), COLUMNS="120", LINES="40", TERM="xterm")
    env.pop("NO_COLOR")
    command = [sys.executable, "-m", "graphwatch", *args]
    main_fd, child_fd = pty.openpty()
    stdout_r, stdout_w = os.pipe()
    shown = {main_fd: b"", stdout_r: b""}
    with standard_streams(child_fd if stdout_too else stdout_w, child_fd, env):
        for fd in (child_fd, stdout_w):
            os.close(fd)
        run = InBackground(command, cwd=cwd, env=env, timeout=TIMEOUT)
        deadline = time.monotonic() + TIMEOUT
        reading = list(shown)
        while time.monotonic() < deadline:
            ready, _, _ = select.select(reading, [], [], 0.1)
            for fd in ready:
                chunk = os.read(fd, 65536)
                shown[fd] += chunk
                if not chunk:  # (the pipe, when the terminal stands for stdout too: nothing writes to it)
                    reading.remove(fd)
            if not ready and not run.running():  # (all it wrote is read)
                break
    for fd in (main_fd, stdout_r):
        os.close(fd)
    return run.result(TIMEOUT).returncode, shown[stdout_r].decode(), shown[main_fd].decode(errors="replace")


def test_progress_line_on_a_terminal_leaves_stdout_clean(tmp_path: Path) -> None:
    train = script(tmp_path, SLOW)
    code, stdout, terminal = run_on_terminal(["run", "--out", str(tmp_path / "out"), str(train)], tmp_path, False)
    assert code == 0, terminal
    assert stdout == "".join(f"script line {i}\n" for i in range(10))  # untouched by the status line
    assert "graphwatch: train.py · step" in terminal and "finding" in terminal
    assert "graph-kept-alive" in terminal  # the summary, on the terminal (stderr)


def test_progress_line_never_splits_the_scripts_lines(tmp_path: Path) -> None:
    train = script(tmp_path, SLOW)
    code, _, terminal = run_on_terminal(["run", "--out", str(tmp_path / "out"), str(train)], tmp_path, True)
    assert code == 0, terminal
    assert "graphwatch: train.py · step" in terminal
    # What stays on the screen: per line, the text after its last carriage return, without escape codes.
    visible = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", line.split("\r")[-1]) for line in terminal.split("\r\n")]
    for i in range(10):  # each of the script's lines arrives whole, on a line of its own
        assert f"script line {i}" in visible, visible


def test_no_progress_line_when_quiet_on_a_terminal(tmp_path: Path) -> None:
    train = script(tmp_path, SLOW.replace("range(10)", "range(3)"))
    code, stdout, terminal = run_on_terminal(["run", "-q", "--out", str(tmp_path / "out"), str(train)], tmp_path, False)
    assert code == 0 and terminal == "" and stdout.count("script line") == 3


# --------------------------------------------------------------------------- report
def test_report_rerenders_saved_traces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = run_script(script(tmp_path, LEAKING), session_options={"snapshots": "off"})
    saved = run.session.save(tmp_path / "leaking.json")
    again = gw("report", saved, "--out", tmp_path / "again", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.rstrip().endswith(f"report: {tmp_path / 'again' / 'index.html'}")
    assert "graph-kept-alive" in again.stdout  # the summary
    assert read_trace(tmp_path / "again")["findings"] == json.loads(saved.read_text())["findings"]
    both = [str(saved), str(tmp_path / "again" / "trace.json")]
    assert main(["report", *both, "--out", str(tmp_path / "both"), "-q"]) == 0
    assert capsys.readouterr().out == f"report: {tmp_path / 'both' / 'index.html'}\n"


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "does not exist"),
        ("{not json", "is not valid JSON"),
        ('{"some": "other json"}', "is not a graphwatch trace"),
        ('{"format": "graphwatch-trace", "version": 99}', "newer than this graphwatch reads"),
    ],
)
def test_report_bad_trace_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str
) -> None:
    trace = tmp_path / "trace.json"
    if content is not None:
        trace.write_text(content)
    assert main(["report", str(trace), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("graphwatch: error: ") and message in err and len(err.strip().splitlines()) == 1


def test_report_bad_trace_subprocess(tmp_path: Path) -> None:
    (tmp_path / "trace.json").write_text('{"format": "graphwatch-trace", "version": 1, "steps": [')
    result = gw("report", "trace.json", "--out", "out", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("graphwatch: error: trace.json is not valid JSON")
    assert "Traceback" not in result.stderr


def test_report_unwritable_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a_file").write_text("")
    graphwatch.model.save_trace(graphwatch.Trace(), tmp_path / "trace.json")
    assert main(["report", str(tmp_path / "trace.json"), "--out", str(tmp_path / "a_file")]) == 2
    assert "it is a file, not a folder" in capsys.readouterr().err


# ----------------------------------------------------------------------------- help
def test_help_and_version_subprocess(tmp_path: Path) -> None:
    result = gw("run", "--help", cwd=tmp_path)
    assert result.returncode == 0 and "usage: graphwatch run" in result.stdout and "--strict" in result.stdout
    version = gw("--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.startswith(f"graphwatch {graphwatch.__version__}")


def test_run_help_states_the_readmes_loop_rule_and_every_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    shown = capsys.readouterr().out
    assert "a step ends at each optimizer.step()" not in shown  # (what it said before: not the rule)
    rule = " ".join(shown.split("How steps are counted:")[1].split("\n\n")[0].split())
    readme = " ".join((REPO / "README.md").read_text().replace("`", "").split())
    for words in ("the training loop is the innermost loop that holds all of them", "a backward() outside "
                  "optimizer.step()", "Without source", "each optimizer.step() ends a step"):  # fmt: skip
        assert words in rule and words in readme, words
    codes = dict(re.findall(r"^  (\d+) +(.+)$", shown.split("exit codes:")[1], re.M))
    assert sorted(codes, key=int) == ["1", "2", "3", "130", "143"]
    assert "uncaught exception" in codes["1"] and "--strict" in codes["3"]
    assert "Ctrl-C" in codes["130"] and "SIGTERM" in codes["143"] and "unwritable" in codes["2"]
    assert "the script's own" in shown.split("exit codes:")[1]


@pytest.mark.parametrize("command", [[], ["run"], ["demo"], ["report"]])
def test_help_of_each_command(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*command, "--help"])
    assert exited.value.code == 0
    assert f"usage: graphwatch {' '.join(command)}".strip() in capsys.readouterr().out


def test_script_arguments_are_passed_verbatim() -> None:
    assert split_script_args(["run", "-q", "--out", "x", "t.py", "--", "-q"]) == (["run", "-q", "--out", "x", "t.py"], ["--", "-q"])
    assert split_script_args(["run", "--strict", "--", "t.py", "a"]) == (["run", "--strict", "--", "t.py"], ["a"])
    assert split_script_args(["run", "--out=x", "t.py"]) == (["run", "--out=x", "t.py"], [])
    run_parser = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["run"]
    valued = {o for a in run_parser._actions if a.option_strings and a.nargs != 0 for o in a.option_strings}
    assert valued == RUN_VALUE_OPTIONS


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().err


# ----------------------------------------------------------------------------- demo
PAIR = {
    "keep_bug.py": LEAKING,
    "keep_fixed.py": CLEAN,
    "twice_bug.py": """\
        import torch
        w = torch.ones(2, requires_grad=True)
        y = (w * w).sum()
        y.backward()
        y.backward()
        """,
}


def test_demo_runs_each_example_and_writes_one_report(tmp_path: Path) -> None:
    examples = tmp_path / "examples"
    examples.mkdir()
    for name, text in PAIR.items():
        script(examples, text, name)
    (examples / "helper.py").write_text("")  # not an example
    assert [e.name for e in find_examples(examples)] == ["keep_bug", "keep_fixed", "twice_bug"]
    console = Console(file=io.StringIO(), width=200)
    code = run_demo(tmp_path / "out", progress=False, folder=examples, console=console)
    printed = console.file.getvalue()
    assert code == 0, printed
    assert "graph-kept-alive" in printed and "backward-through-freed-graph" in printed
    assert "raised BackwardTwiceError" in printed and "clean" in printed
    assert f"report: {tmp_path / 'out' / 'index.html'}" in printed
    assert (tmp_path / "out" / "index.html").is_file()
    headline = "graphwatch demo: 2 bug examples: 2 found; 1 fixed twin: clean"
    assert printed.splitlines()[0] == headline  # what the demo showed, not a count of problems
    assert f'<h1 class="verdict good">{headline}</h1>' in (tmp_path / "out" / "index.html").read_text()


def test_demo_without_examples_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(graphwatch.UsageError, match=r"bundled examples are missing.*pip install -e"):
        find_examples(tmp_path / "nowhere")


@pytest.mark.skipif(not (REPO / "examples").is_dir(), reason="needs the repository's examples/ folder")
def test_demo_subprocess_on_the_bundled_examples(tmp_path: Path) -> None:
    result = gw("demo", "--out", tmp_path / "demo", cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "report:" in result.stdout
    assert (tmp_path / "demo" / "index.html").is_file()
    examples = find_examples(REPO / "examples")
    bugs = sum(e.is_bug for e in examples)
    fixed = sum(e.name.endswith("_fixed") for e in examples)
    assert f"graphwatch demo: {bugs} bug examples: {bugs} found; {fixed} fixed twins: clean\n" in result.stdout


# -------------------------------------------------------------------------- helpers
def test_helpers(tmp_path: Path) -> None:
    assert exit_code_of(SystemExit(None)) == 0 and exit_code_of(SystemExit(-1)) == 255
    assert trace_labels([str(tmp_path / "lstm" / "trace.json"), "a/trace.json", "b/a/trace.json"]) == ["lstm", "a", "a (2)"]
    assert check_out_dir(tmp_path / "new" / "dir").is_dir()
    with pytest.raises(graphwatch.UsageError, match=r"folder without __main__\.py"):
        check_script(tmp_path)


def test_run_prints_a_backward_twice_explanation_once_under_the_users_own_frames(tmp_path: Path) -> None:
    script = tmp_path / "twice.py"
    script.write_text(
        "import torch\n"
        "x = torch.ones(3, requires_grad=True)\n"
        "y = (x.exp() * 2).sum()\n"
        "y.backward()\n"
        "y.backward()  # the second one\n"
    )
    result = gw("run", "--out", tmp_path / "out", script, cwd=tmp_path)
    assert result.returncode == 1
    frames = re.findall(r'^  File "([^"]+)", line \d+', result.stderr, re.M)
    # no frame of graphwatch's own files (a folder named graphwatch elsewhere in a path, e.g. the clone's, is no sign)
    assert frames and not [frame for frame in frames if Path(frame).resolve().is_relative_to(PACKAGE)], frames
    assert frames[0].endswith("twice.py") and "y.backward()  # the second one" in result.stderr
    assert result.stderr.count("Fixes, best first:") == 1
    assert "explained, with its fixes, in the error that ended the run" in result.stderr
