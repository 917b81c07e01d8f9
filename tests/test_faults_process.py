"""Faults of the process, each compared with the same program run without graphwatch (issue 16, items 2-5).

Real subprocesses, real signals (by PID, and to a process group with real
DataLoader workers), real files.  No timings: waits are bounded by timeouts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import warm_python
from warm_child import SAY_READY, run_and_signal

import graphwatch

REPO = Path(graphwatch.__file__).resolve().parents[2]
TIMEOUT = 120
DEEP = 60_000  # nodes: beyond the ~45,000 an 8 MiB stack frees once Python touched them


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONWARNINGS="ignore", NO_COLOR="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def _script(folder: Path, text: str, name: str = "train.py") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def _run(args: list[str], cwd: Path, *, cold: bool = False, **kwargs) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in ``cwd``, forked off a warm interpreter (tests/warm_python.py), or ``cold``: started afresh,
    for what a fork would inherit from the server (stack limits, thread stacks, signal handling)."""
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run if cold else warm_python.run
    return run([sys.executable, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT, **kwargs)


def _watched(script: Path, out: Path | str, *extra: str, **kwargs) -> subprocess.CompletedProcess[str]:
    return _run(["-m", "graphwatch", "run", "--out", str(out), *extra, str(script)], script.parent, **kwargs)


# ------------------------------------------------------------------ item 2: deep graphs
DEEP_CHAIN = f"""\
    import sys, threading, torch
    watched = sys.argv[1] == "watched"
    def train():
        import contextlib, graphwatch
        w = torch.ones(1, requires_grad=True)
        with graphwatch.watch(summary=False) if watched else contextlib.nullcontext():
            y = torch.ones(1, requires_grad=True)
            for _ in range({DEEP}):
                y = y * w  # saves y: graphwatch's pack hook touches every node
            y.sum().backward()
            del y  # torch frees the chain here
    if sys.argv[2] == "thread":
        thread = threading.Thread(target=train)
        thread.start()
        thread.join()
    else:
        train()
    print("done")
"""


@pytest.mark.parametrize("how", ["bare", "watched"])
def test_deep_graph_freed_in_a_worker_thread_does_not_crash(tmp_path, how):
    done = _run([str(_script(tmp_path, DEEP_CHAIN)), how, "thread"], tmp_path, cold=True)
    assert (done.returncode, done.stdout) == (0, "done\n"), done.stderr[-2000:]


def _hard_stack_limit() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_STACK, (8 << 20, 8 << 20))


@pytest.mark.parametrize("how", ["bare", "watched"])
def test_deep_graph_freed_under_a_hard_8_mib_stack_limit_does_not_crash(tmp_path, how):
    done = _run([str(_script(tmp_path, DEEP_CHAIN)), how, "main"], tmp_path, cold=True, preexec_fn=_hard_stack_limit)
    assert (done.returncode, done.stdout) == (0, "done\n"), done.stderr[-2000:]


# ------------------------------------------------------------------ item 3: process state given back
STATE = """\
    import resource, signal, subprocess, sys, torch, graphwatch
    def mine(signum, frame):
        pass
    before = resource.getrlimit(resource.RLIMIT_STACK)
    w = torch.ones(3, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    with graphwatch.watch(summary=False):
        for _ in range(3):
            opt.zero_grad()
            loss = (w * w).exp().sum()  # module-level: its graph is alive after the session
            loss.backward()
            opt.step()
        signal.signal(signal.SIGINT, mine)  # installed by the user inside the session
    child = subprocess.run([sys.executable, "-c", "import resource; print(resource.getrlimit(resource.RLIMIT_STACK))"],
                           capture_output=True, text=True).stdout.strip()
    print(before == resource.getrlimit(resource.RLIMIT_STACK), child == str(before), signal.getsignal(signal.SIGINT) is mine)
"""


def test_stack_limit_and_the_users_sigint_handler_are_as_they_would_be_without_graphwatch(tmp_path):
    done = _run([str(_script(tmp_path, STATE))], tmp_path, cold=True)
    assert (done.returncode, done.stdout) == (0, "True True True\n"), done.stderr[-2000:]


# ------------------------------------------------------------------ item 4: signals
def _stop_when_ready(proc: subprocess.Popen, send) -> str:
    """Wait (bounded) for the script's "ready" line, call ``send()``, return stderr once it exits."""
    try:
        ready = threading.Event()
        threading.Thread(target=lambda: proc.stdout.readline() == "ready\n" and ready.set(), daemon=True).start()
        assert ready.wait(TIMEOUT), "the script never printed 'ready'"
        send()
        return proc.communicate(timeout=TIMEOUT)[1]
    finally:
        proc.kill()


SWALLOWS = f"""\
    import torch
    w = torch.ones(3, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    for step in range(10**9):
        try:  # "skip a bad batch"
            opt.zero_grad(); (w * w).exp().sum().backward(); opt.step()
            if step == 3:
                {SAY_READY}
        except:  # noqa: E722
            pass
"""


@pytest.mark.parametrize("how", ["bare", "watched"])
def test_a_bare_except_does_not_swallow_sigterm(tmp_path, how):
    script = _script(tmp_path, SWALLOWS)
    args = [str(script)] if how == "bare" else ["-m", "graphwatch", "run", "--out", "out", str(script)]
    done = run_and_signal([sys.executable, *args], signal.SIGTERM, cwd=tmp_path, env=_env(), timeout=TIMEOUT)
    stderr = done.stderr
    assert done.returncode == (-signal.SIGTERM if how == "bare" else 143), stderr
    if how == "watched":
        assert graphwatch.load(tmp_path / "out" / "trace.json").ended_early.startswith("Terminated")
        assert "marked as ended early" in stderr


LOADER = """\
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    if __name__ == "__main__":
        data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for epoch in range(10**9):
            for step, (x, y) in enumerate(DataLoader(data, batch_size=8, num_workers=2)):
                opt.zero_grad(); torch.nn.functional.mse_loss(model(x), y).backward(); opt.step()
                if epoch == 0 and step == 3:
                    print("ready", flush=True)
"""


def test_sigterm_to_the_process_group_with_dataloader_workers_gives_the_report_and_143(tmp_path):
    script = _script(tmp_path, LOADER)
    proc = subprocess.Popen([sys.executable, "-m", "graphwatch", "run", "--out", "out", str(script)], cwd=tmp_path,
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    stderr = _stop_when_ready(proc, lambda: os.killpg(proc.pid, signal.SIGTERM))
    assert proc.returncode == 143, stderr
    assert "Traceback" not in stderr and "killed by signal" not in stderr, stderr
    assert graphwatch.load(tmp_path / "out" / "trace.json").ended_early
    assert (tmp_path / "out" / "index.html").is_file()


# A SIGCHLD (a DataLoader worker killed by the same SIGTERM) trips at the C level while the script's handler is
# installed, and is handled after the SIGTERM's handler has shielded the children: CPython runs whatever handler
# it finds then (blocked, both are delivered together, SIGTERM's handler first)
PENDING_CHILD_SIGNAL = """\
    import os, signal
    from graphwatch.signals import SignalGuard
    signal.signal(signal.SIGCHLD, lambda *a: print("the script's SIGCHLD handler ran"))
    with SignalGuard() as guard:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGCHLD})
        os.kill(os.getpid(), signal.SIGCHLD)
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGCHLD})
        print("terminated" if guard.terminated else "not terminated")
"""


@pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="needs POSIX signal masks")
def test_a_child_signal_pending_when_sigterm_shields_the_children_runs_no_handler_and_raises_nothing(tmp_path):
    """(It raised "OSError: Signal 17 ignored due to race condition" wherever the script was: the shield set
    SIGCHLD to SIG_DFL, and CPython refuses a pending signal whose handler became SIG_DFL.)"""
    done = _run([str(_script(tmp_path, PENDING_CHILD_SIGNAL))], tmp_path)
    assert done.returncode == 0 and done.stdout == "terminated\n", done.stdout + done.stderr
    assert "race condition" not in done.stderr and "Traceback" not in done.stderr, done.stderr

# A thread's error after SIGTERM arrived (the resource sharer of a DataLoader's killed workers): without graphwatch
# SIGTERM ends the process first, so it is not printed; after the guard, a thread's error is printed as always
THREAD_ERROR_AFTER_SIGTERM = """\
    import os, signal, threading
    from graphwatch.signals import SignalGuard
    def fails():
        raise RuntimeError("a thread's error")
    with SignalGuard(signals=(signal.SIGTERM,)) as guard:
        os.kill(os.getpid(), signal.SIGTERM)  # (not armed: noted, as while the report is written)
        thread = threading.Thread(target=fails); thread.start(); thread.join()
        print("terminated" if guard.terminated else "not terminated")
    thread = threading.Thread(target=fails); thread.start(); thread.join()
"""


def test_an_error_in_another_thread_after_sigterm_arrived_is_not_printed_and_after_the_guard_it_is(tmp_path):
    done = _run([str(_script(tmp_path, THREAD_ERROR_AFTER_SIGTERM))], tmp_path)
    assert done.returncode == 0 and done.stdout == "terminated\n", done.stdout + done.stderr
    assert done.stderr.count("RuntimeError: a thread's error") == 1, done.stderr  # (the one after the guard)


CTRL_C_IN_REPORT = """\
    import os, signal, torch
    import graphwatch.rendering.html as html
    write = html.write_report
    def interrupted_write(*args, **kwargs):  # one Ctrl-C lands while the report is written
        os.kill(os.getpid(), signal.SIGINT)
        return write(*args, **kwargs)
    html.write_report = interrupted_write
    w = torch.ones(3, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    for _ in range(3):
        opt.zero_grad(); (w * w).exp().sum().backward(); opt.step()
"""


def test_one_ctrl_c_while_the_report_is_written_keeps_the_report(tmp_path):
    done = _watched(_script(tmp_path, CTRL_C_IN_REPORT), "out")
    assert done.returncode == 130, done.stderr
    assert len(graphwatch.load(tmp_path / "out" / "trace.json").steps) == 3
    assert (tmp_path / "out" / "index.html").is_file()


def test_a_correct_loop_interrupted_inside_a_forward_has_no_finding():
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = {"n": 0}

    def interrupt(module, inputs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt

    model.register_forward_pre_hook(interrupt)
    with pytest.raises(KeyboardInterrupt):
        with graphwatch.watch(summary=False) as gw:
            for _ in range(10):
                opt.zero_grad()
                loss = model(torch.randn(8, 4)).pow(2).mean()
                loss.backward()
                opt.step()
    assert gw.trace.ended_early == "KeyboardInterrupt"
    assert gw.findings == []


# ------------------------------------------------------------------ item 5: output and exit codes
def test_relative_out_is_resolved_before_the_script_changes_folder(tmp_path):
    (tmp_path / "runs").mkdir()
    script = _script(tmp_path, "import os\nos.chdir('runs')\n")
    done = _watched(script, "report")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "report" / "trace.json").is_file() and not (tmp_path / "runs" / "report").exists()


@pytest.mark.parametrize("how", ["bare", "watched"])
def test_closed_stdout_keeps_the_scripts_exit_code(tmp_path, how):
    script = _script(tmp_path, "import sys\nprint('lost')\nsys.exit(5)\n")
    args = [str(script)] if how == "bare" else ["-m", "graphwatch", "run", "--out", "out", str(script)]
    done = subprocess.run([sys.executable, *args], cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=TIMEOUT,
                          preexec_fn=lambda: os.close(1))
    assert done.returncode == 5, done.stderr
    assert "Traceback" not in done.stderr
    if how == "watched":
        assert (tmp_path / "out" / "trace.json").is_file()


SPOILS_OUT = """\
    import pathlib, shutil, sys, torch
    w = torch.ones(3, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    for _ in range(3):
        opt.zero_grad(); (w * w).exp().sum().backward(); opt.step()
    shutil.rmtree("out")
    pathlib.Path("out").write_text("a file where the report folder was")
    sys.exit(int(sys.argv[1]))
"""


@pytest.mark.parametrize(("script_code", "code"), [(0, 2), (4, 4)])
def test_an_unwritable_out_at_the_end_prints_the_summary_and_says_so(tmp_path, script_code, code):
    script = _script(tmp_path, SPOILS_OUT)
    done = _run(["-m", "graphwatch", "run", "--out", "out", str(script), str(script_code)], tmp_path)
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    assert "graphwatch: no graph leaks in 3 steps" in done.stderr  # the summary
    assert sum("the report could not be written" in line for line in done.stderr.splitlines()) == 1
    kept = Path(done.stderr.split("the trace was saved to ")[1].split(" (graphwatch report")[0])  # not lost
    assert len(graphwatch.load(kept).steps) == 3
    kept.unlink()


FORKS = """\
    import os, torch
    w = torch.ones(3, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    for _ in range(3):
        opt.zero_grad(); (w * w).exp().sum().backward(); opt.step()
    pid = os.fork()
    if pid == 0:
        opt.zero_grad(); (w * w).exp().sum().backward(); opt.step()  # one more step, in the child only
        raise SystemExit(7)
    _, status = os.waitpid(pid, 0)
    print("child", os.waitstatus_to_exitcode(status))
"""


LIBRARY_FORKS = """\
    import os, sys, torch, graphwatch
    w = torch.ones(3, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    with graphwatch.watch(out=sys.argv[1]) as gw:
        for _ in range(3):
            opt.zero_grad(); (w * w).exp().sum().backward(); opt.step()
        pid = os.fork()
        if pid == 0:
            opt.zero_grad(); (w * w).exp().sum().backward(); opt.step()  # one more step, in the child only
    if pid == 0:
        os._exit(7)
    _, status = os.waitpid(pid, 0)
    print("child", os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_leaving_a_library_session_writes_no_report(tmp_path):
    script = _script(tmp_path, LIBRARY_FORKS)
    done = _run([str(script), str(tmp_path / "out")], tmp_path)
    assert (done.returncode, done.stdout) == (0, "child 7\n"), done.stderr
    trace = json.loads((tmp_path / "out" / "trace.json").read_text())
    assert trace["steps"]["count"] == 3  # the parent's, not the child's four
    assert done.stderr.count("graphwatch:") == 1  # one summary: the child prints none


def test_a_forked_child_does_not_write_over_the_parents_report(tmp_path):
    done = _watched(_script(tmp_path, FORKS), "out")
    assert (done.returncode, done.stdout) == (0, "child 7\n"), done.stderr
    trace = json.loads((tmp_path / "out" / "trace.json").read_text())
    assert trace["steps"]["count"] == 3 and not trace.get("ended_early")
