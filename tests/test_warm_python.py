"""The tests' warm Python (``warm_python.run``) gives what a fresh ``python`` gives: the same output, exit code and
traceback, in the same folder, environment, ``sys.argv`` and ``sys.path``, with the same standard input."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import warm_python

SHOWS_ITS_START = """\
import os, sys, warnings
import torch
import helper
print(sys.argv, sys.path[:2], os.getcwd(), os.environ.get("ASKED"), helper.VALUE, sys.stdin.read())
warnings.warn("a warning of the script's")
print("to stderr", file=sys.stderr)
if sys.argv[1] == "raise":
    raise ValueError("raised by the script")
sys.exit(int(sys.argv[1]) if sys.argv[1].isdigit() else sys.argv[1])
"""


@pytest.mark.parametrize("how", ["0", "3", "a message", "raise"])
def test_a_forked_run_prints_and_ends_as_a_fresh_interpreter(tmp_path: Path, how: str) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "helper.py").write_text("VALUE = 42\n")
    script = tmp_path / "train.py"
    script.write_text(SHOWS_ITS_START)
    env = dict(os.environ, ASKED="yes", PYTHONPATH=str(tmp_path / "lib"),
               PYTHONWARNINGS="ignore" if how == "3" else "default")  # fmt: skip
    args = [sys.executable, script.name, how]
    warm = warm_python.run(args, cwd=tmp_path, env=env, input="typed", capture_output=True, text=True, timeout=300)
    cold = subprocess.run(args, cwd=tmp_path, env=env, input="typed", capture_output=True, text=True, timeout=300)
    assert (warm.returncode, warm.stdout, warm.stderr) == (cold.returncode, cold.stdout, cold.stderr)
    assert "42 typed" in warm.stdout and ("ValueError: raised by the script" in warm.stderr) == (how == "raise")


def test_w_options_filter_a_forked_runs_warnings_as_a_fresh_interpreters(tmp_path: Path) -> None:
    (tmp_path / "warns.py").write_text(
        "import sys, warnings\nprint(sys.argv, sys.warnoptions)\nwarnings.warn('the script warns')\nprint('after')\n"
    )
    args = [sys.executable, "-W", "ignore", "-W", "error::UserWarning", "warns.py", "-W"]
    env = dict(os.environ, PYTHONWARNINGS="default")
    warm = warm_python.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    cold = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert (warm.returncode, warm.stdout, warm.stderr) == (cold.returncode, cold.stdout, cold.stderr)
    assert warm.returncode == 1 and "UserWarning: the script warns" in warm.stderr and "after" not in warm.stdout
    assert "['warns.py', '-W'] ['default', 'ignore', 'error::UserWarning']" in warm.stdout


def test_python_m_graphwatch_runs_forked_as_it_runs_fresh(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import torch\nx = torch.ones(2, requires_grad=True)\n(x * x).sum().backward()\nprint(x.grad)\n")
    args = [sys.executable, "-m", "graphwatch", "run", "--out", "", "--no-progress", script.name]
    env = dict(os.environ, NO_COLOR="1", COLUMNS="100")
    warm = warm_python.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    cold = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert (warm.returncode, warm.stdout) == (cold.returncode, cold.stdout) == (0, "tensor([2., 2.])\n")
    steps = [line for line in warm.stderr.splitlines() if "no graph leaks" in line]
    assert steps and steps == [line for line in cold.stderr.splitlines() if "no graph leaks" in line]


def test_a_forked_run_past_its_timeout_is_killed_as_subprocess_kills_it(tmp_path: Path) -> None:
    (tmp_path / "sleeps.py").write_text("import time\nprint('started', flush=True)\ntime.sleep(600)\n")
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        warm_python.run([sys.executable, "sleeps.py"], cwd=tmp_path, capture_output=True, timeout=5)
    assert time.monotonic() - started < 120
    after = warm_python.run([sys.executable, "-m", "graphwatch", "--version"], capture_output=True, text=True)
    assert after.returncode == 0 and after.stdout.startswith("graphwatch")  # the server serves on


def test_what_python_reads_at_start_up_differing_means_a_fresh_start() -> None:
    here = dict(os.environ)
    assert warm_python._can_fork([sys.executable, "train.py"], here)
    assert warm_python._can_fork([sys.executable, "-m", "graphwatch"], {**here, "PYTHONPATH": "/elsewhere"})
    assert not warm_python._can_fork([sys.executable, "train.py"], {**here, "LC_ALL": "C"})
    assert not warm_python._can_fork([sys.executable, "train.py"], {**here, "OMP_NUM_THREADS": "7"})
    assert warm_python._can_fork([sys.executable, "train.py"], {**here, "TORCHINDUCTOR_CACHE_DIR": "/c"})  # (first use)
    assert warm_python._can_fork([sys.executable, "-W", "error", "train.py"], here)
    assert not warm_python._can_fork([sys.executable, "-X", "dev", "train.py"], here)
    assert not warm_python._can_fork([sys.executable, "-W", "error"], here)
    assert not warm_python._can_fork(["python3", "train.py"], here)


def test_a_change_to_this_processs_own_start_up_variables_starts_the_server_again(tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """An import in the test process that sets a variable torch reads at start-up (Lightning sets two) would make
    every later run a cold start: the server starts again with the new environment instead, once."""
    script = tmp_path / "parent.py"
    script.write_text("import os\nprint(os.getppid(), os.environ.get('TORCH_GRAPHWATCH_PROBE'))\n")
    args = [sys.executable, str(script)]
    before = warm_python.run(args, capture_output=True, text=True, timeout=300).stdout.split()
    server = warm_python._server
    assert server is not None and before == [str(server[0].pid), "None"]  # forked off the server
    monkeypatch.setenv("TORCH_GRAPHWATCH_PROBE", "1")
    after = [warm_python.run(args, capture_output=True, text=True, timeout=300).stdout.split() for _ in range(2)]
    again = warm_python._server
    assert again is not None and again[0].pid != server[0].pid
    assert after == [[str(again[0].pid), "1"]] * 2  # forked off the new server, both times
