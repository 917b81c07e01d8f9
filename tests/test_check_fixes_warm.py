"""``--check-fixes`` patched runs forked off a warm zygote (:mod:`graphwatch.warm_start`): real processes, real patches.

A patched run started warm gives the verdict a cold start gives; the zygote and every patched run are gone after
the run, after a timeout, after SIGTERM and after SIGKILL to graphwatch; a patched run imports the patched copy
of a module of the script's folder; ``GRAPHWATCH_CHECK_COLD=1`` starts each patched run cold.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import warm_python
from test_check_fixes import KEPT_LOGITS, checked_warm, write
from test_check_fixes_safety import (
    LINUX,
    HangingCheck,
    environment,
    graphwatch_command,
    hanging_check,
    processes_in,
    processes_with,
    wait_for,
)

import graphwatch

# The patched run (the script started in the copy of its folder) writes how its process was started: its command
# line, to the file its first argument names.
RECORDS_ITS_START = """import os, sys
if "graphwatch-check-" in os.path.abspath(__file__):
    with open(sys.argv[1], "a") as record:
        record.write(open("/proc/self/cmdline").read().replace(chr(0), " ") + chr(10))
""" + KEPT_LOGITS

# A script whose validation lives in a module of its folder; the check's patch edits that module.
USES_HELPER = KEPT_LOGITS.replace("import torch\n", "import torch\nfrom helper import validate\n", 1).replace(
    "    val_logits = model(x_val).squeeze(1)\n    val_history.append(val_logits)\n",
    "    validate(model, x_val, val_history)\n",
)
HELPER = "def validate(model, x_val, history):\n    history.append(model(x_val).squeeze(1))\n"
PATCHED_HELPER = """--- helper.py
+++ helper.py
@@ -1,2 +1,2 @@
 def validate(model, x_val, history):
-    history.append(model(x_val).squeeze(1))
+    history.append(model(x_val).squeeze(1).detach())
"""


def started_checks(tmp_path: Path, name: str, **env: str) -> tuple[graphwatch.model.PatchCheck, str]:
    """``graphwatch run --check-fixes`` of RECORDS_ITS_START with ``env``: its one check, and how its patched run
    started (the command line)."""
    folder = tmp_path / name
    write(folder, "train.py", RECORDS_ITS_START)
    record, report = tmp_path / f"{name}-started.txt", tmp_path / f"{name}-report"
    done = warm_python.run(graphwatch_command("--check-fixes", "--check-allow-path", str(record), "--out", str(report),
                                              "train.py", str(record)),
                           cwd=folder, env=environment(tmp_path, **env), capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr
    [check] = {id(f.check): f.check for f in graphwatch.load(report / "trace.json").findings if f.check}.values()
    return check, record.read_text()


@LINUX
def test_a_patch_checked_warm_gets_the_verdict_and_figures_a_cold_start_gets_and_the_cold_variable_starts_cold(
    tmp_path: Path,
) -> None:
    cold, cold_start = started_checks(tmp_path, "cold", GRAPHWATCH_CHECK_COLD="1")
    warm, warm_start = started_checks(tmp_path, "warm")
    assert cold.checked and cold.steps > 0
    assert (warm.checked, warm.steps, warm.held, warm.failed, warm.skipped) == (
        cold.checked, cold.steps, cold.held, cold.failed, cold.skipped
    )  # fmt: skip
    assert "--stop-after" in cold_start  # a cold `python -m graphwatch run --stop-after N ...`
    assert "--stop-after" not in warm_start and warm_start.count("\n") == 1  # forked: graphwatch's command line


@LINUX
def test_a_patched_run_imports_the_patched_module_of_its_folder_which_the_zygote_never_imported(tmp_path: Path) -> None:
    folder = tmp_path / "project"
    write(folder, "train.py", USES_HELPER)
    write(folder, "helper.py", HELPER)
    [check], started = checked_warm(folder / "train.py", "graph-kept-alive", PATCHED_HELPER, env=environment(tmp_path))
    assert (check.checked, check.failed, started) == (True, [], ["WarmProcess"]), check


def hanging(tmp_path: Path, timeout: str) -> HangingCheck:
    """``graphwatch run --check-fixes`` whose patched run hangs, returned once it hangs, with graphwatch, its
    zygote and the patched run forked off it seen running in the test's folder (with the patched run's `sleep`)."""
    check = hanging_check(tmp_path, timeout)
    try:
        started = processes_in(tmp_path)
        assert check.pid in started and len(started) == 4, started  # graphwatch, its zygote, the patched run, sleep
    except BaseException:
        os.kill(check.pid, signal.SIGKILL)
        raise
    return check


@LINUX
def test_the_zygote_and_the_patched_run_are_gone_after_a_run_whose_check_timed_out(tmp_path: Path) -> None:
    check = hanging(tmp_path, timeout="10")
    done = check.ended(300)
    assert done.returncode == 0, done.stderr
    assert "it did not end within 10 s" in done.stderr
    assert processes_in(tmp_path) == [] and processes_with(f"sleep {check.marker}") == []


@LINUX
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_the_zygote_and_the_patched_run_are_gone_after_a_signal_to_graphwatch(tmp_path: Path, signum: int) -> None:
    check = hanging(tmp_path, timeout="600")
    os.kill(check.pid, signum)
    assert check.ended(60).returncode == (143 if signum == signal.SIGTERM else -signal.SIGKILL)
    if signum == signal.SIGTERM:  # ended by graphwatch before it exits
        assert processes_in(tmp_path) == [] and processes_with(f"sleep {check.marker}") == []
    else:  # the zygote sees graphwatch gone and ends the patched run's processes
        wait_for(lambda: processes_in(tmp_path) == [] and processes_with(f"sleep {check.marker}") == [], seconds=30)
