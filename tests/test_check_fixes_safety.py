"""``graphwatch run --check-fixes`` probed as an attacker would: what the copy reads, where the patched run may
write, and what is left when a patched run hangs or graphwatch is stopped during a check.

Real files (a link to ``/dev/zero``, a FIFO, a device node), real ``graphwatch run`` processes (forked off the
tests' warm Python: ``tests/warm_python.py``), real signals; what is left afterwards is read from the file system
and ``/proc``.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
import warm_python
from test_check_fixes import KEPT_LOGITS, folder_digest, write
from warm_child import READY, SAY_READY, InBackground

import graphwatch
from graphwatch import fix_checks_copy
from graphwatch.fix_checks import remove_stale_scratch
from graphwatch.fix_checks_copy import FolderTooLarge, copy_folder, folder_refusal, survey
from graphwatch.fix_checks_paths import outside_arguments

LINUX = pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads processes from /proc")

# Started in the copy of its folder (the patched run), the script starts `sleep MARKER` and hangs before training;
# started in its own folder (the run graphwatch checks), it writes its process id (graphwatch's) to READY there.
HANGS_IN_THE_COPY = f"""import os, subprocess, sys, time
if "graphwatch-check-" in os.path.abspath(__file__):
    subprocess.Popen(["sleep", sys.argv[1]])
    time.sleep(300)
else:
    {SAY_READY}
""" + KEPT_LOGITS


def graphwatch_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "graphwatch", "run", *args]


def environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This process's environment with a temporary folder of the test's own (``TMPDIR``) and ``extra``."""
    scratch = tmp_path / "tmpdir"
    scratch.mkdir(exist_ok=True)
    return dict(os.environ, TMPDIR=str(scratch), COLUMNS="1000", **extra)


def processes_with(text: str) -> list[int]:
    """The pids of live processes whose command line holds ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode():
                state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
                if state != "Z":  # a zombie has ended
                    found.append(int(entry.name))
        except OSError:  # ended meanwhile
            continue
    return found


def processes_in(folder: Path) -> list[int]:
    """The pids of live processes whose working folder lies in ``folder``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and Path(os.readlink(entry / "cwd")).is_relative_to(folder):
                found.append(int(entry.name))
        except OSError:  # ended meanwhile (a zombie has no working folder), or not ours
            continue
    return found


def marker_for(tmp_path: Path) -> str:
    """A `sleep` argument no other process of the machine has."""
    return f"300.{abs(hash(str(tmp_path))) % 10**9}"


def wait_for(condition: Callable[[], object], seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "gave up waiting"
        time.sleep(0.1)


class HangingCheck(NamedTuple):
    """A ``graphwatch run --check-fixes`` running in the background whose patched run hangs."""

    run: InBackground
    pid: int  # graphwatch's process
    report: Path
    marker: str  # the argument of the `sleep` the patched run started

    def ended(self, seconds: float) -> subprocess.CompletedProcess[str]:
        """How graphwatch ended, waited for at most ``seconds`` (after which it is killed and the test fails)."""
        try:
            return self.run.result(seconds)
        finally:
            if self.run.running():
                os.kill(self.pid, signal.SIGKILL)


def hanging_check(tmp_path: Path, timeout: str) -> HangingCheck:
    """``graphwatch run --check-fixes`` of HANGS_IN_THE_COPY in the background (forked off the warm Python, as a
    cold start would run it), with the patched run's ``GRAPHWATCH_CHECK_TIMEOUT`` ``timeout``; returned once the
    patched run hangs (its `sleep` is seen running)."""
    marker = marker_for(tmp_path)
    folder = tmp_path / "project"
    write(folder, "train.py", HANGS_IN_THE_COPY)
    report = tmp_path / "report"
    run = InBackground(graphwatch_command("--check-fixes", "--out", str(report), "train.py", marker), cwd=folder,
                       env=environment(tmp_path, GRAPHWATCH_CHECK_TIMEOUT=timeout), capture_output=True, text=True,
                       timeout=300)  # fmt: skip
    wait_for(lambda: processes_with(f"sleep {marker}") or not run.running())
    assert run.running(), run.result(0).stderr
    return HangingCheck(run, int((folder / READY).read_text()), report, marker)


# ------------------------------------------------------------------ what the copy reads
def test_the_copy_takes_regular_files_only_never_a_device_a_fifo_or_a_link_out_of_the_folder(tmp_path: Path) -> None:
    folder = tmp_path / "project"
    write(folder, "train.py", "x = 1\n")
    write(tmp_path / "elsewhere", "data.txt", "outside")
    (folder / "zero").symlink_to("/dev/zero")  # stat says size 0; reading it never ends
    (folder / "outside.txt").symlink_to(tmp_path / "elsewhere" / "data.txt")
    (folder / "inside.txt").symlink_to(folder / "train.py")
    os.mkfifo(folder / "pipe")  # opening it for reading would wait for a writer
    try:
        os.mknod(folder / "null", stat.S_IFCHR | 0o600, os.makedev(1, 3))  # the character device /dev/null is
        device = True
    except (PermissionError, OSError):
        device = False
    skipped = copy_folder(folder, tmp_path / "copy")
    assert "zero (a link out of the folder)" in skipped and "outside.txt (a link out of the folder)" in skipped
    assert "pipe (not a regular file)" in skipped
    assert ("null (not a regular file)" in skipped) is device
    copied = sorted(p.name for p in (tmp_path / "copy").iterdir())
    assert copied == ["inside.txt", "train.py"]  # a link to a file inside the folder: its content
    assert (tmp_path / "copy" / "inside.txt").read_text() == "x = 1\n"
    assert not (tmp_path / "copy" / "inside.txt").is_symlink()


def test_files_that_hold_secrets_are_never_copied_and_the_copy_says_so(tmp_path: Path) -> None:
    folder = tmp_path / "project"
    write(folder, "train.py", "x = 1\n")
    for name in (".env", ".env.local", ".ssh/id_rsa", ".aws/credentials", "certs/server.pem", "deploy.key", ".netrc"):
        write((folder / name).parent, Path(name).name, "secret\n")
    skipped = copy_folder(folder, tmp_path / "copy")
    assert sorted(skipped) == [".aws/ (holds secrets by convention)", ".env (holds secrets by convention)",
                               ".env.local (holds secrets by convention)", ".netrc (holds secrets by convention)",
                               ".ssh/ (holds secrets by convention)", "certs/server.pem (holds secrets by convention)",
                               "deploy.key (holds secrets by convention)"]  # fmt: skip
    copied = sorted(str(p.relative_to(tmp_path / "copy")) for p in (tmp_path / "copy").rglob("*"))
    assert copied == ["certs", "train.py"]


def test_a_folder_over_the_limits_is_refused_and_its_walk_stops_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fix_checks_copy, "MAX_FILES", 5)
    folder = tmp_path / "project"
    for n in range(3):
        for m in range(4):
            write(folder / f"part{n}", f"{m}.txt", "x")
    write(folder, "a.txt", "x")
    write(folder, "b.txt", "x")  # the folder's own 5 entries are within the limit, not those under it
    said = survey(folder)
    assert said == (f"the folder {folder} holds over 5 files and folders (--check-fixes copies at most 512.0 MiB in 5 "
                    "files); run graphwatch from the folder of the script's project")  # fmt: skip
    with pytest.raises(FolderTooLarge, match="over 5 files and folders"):
        copy_folder(folder, tmp_path / "copy")
    copied = sorted(str(p.relative_to(tmp_path / "copy")) for p in (tmp_path / "copy").rglob("*") if p.is_file())
    assert copied == ["a.txt", "b.txt"]  # the walk stopped on entering part0


@pytest.mark.parametrize("start", ["home", "root"])
def test_check_fixes_refuses_to_start_from_a_home_folder_or_the_root_and_says_where_to_run(
    tmp_path: Path, start: str
) -> None:
    home = tmp_path / "home"
    script = write(home / "project", "train.py", "open('ran.txt', 'w').write('ran')\n")
    cwd = home if start == "home" else Path("/")
    done = warm_python.run(graphwatch_command("--check-fixes", "--out", str(tmp_path / "report"), str(script)), cwd=cwd,
                           env=environment(tmp_path, HOME=str(home)), capture_output=True, text=True, timeout=120)  # fmt: skip
    what = f"{home} is a home folder" if start == "home" else "/ is a system folder"
    assert done.returncode == 2
    assert f"--check-fixes: --check-fixes copies the folder you run from, and {what}" in done.stderr
    assert f"run graphwatch from your project's folder (e.g. cd {script.parent})" in done.stderr
    assert not (cwd / "ran.txt").exists() and not (script.parent / "ran.txt").exists()  # nothing ran
    assert folder_refusal(home / "project", script) == ""


# ------------------------------------------------------------------ where the patched run may write
def test_paths_outside_the_folder_are_found_wherever_an_argument_holds_them(tmp_path: Path) -> None:
    root = tmp_path / "project"
    args = ["-o/x/log.txt", "--log=/x/log.txt", "/x/exp1", "~/runs", "../elsewhere/a.txt", "--files=a.txt,/x/b.txt",
            "-v", "--out=runs/a", "data/x.csv", "--url=https://example.com/a/b", "/dev/null", f"{root}/runs"]  # fmt: skip
    refused = outside_arguments(args, root, root, [])
    assert refused == args[:6]
    assert outside_arguments(args, root, root, [Path("/x"), Path.home(), tmp_path / "elsewhere"]) == []


@pytest.mark.parametrize(
    "arguments, variables, named",
    [
        (["-o{log}"], {}, "the argument -o{log}"),  # a short option glued to its path
        (["--log={log}"], {}, "the argument --log={log}"),
        (["--prefix", "{outside}/exp1"], {}, "the argument {outside}/exp1"),  # the script writes exp1_ckpt.txt
        ([], {"RUN_LOG": "{log}"}, "the environment variable RUN_LOG={log}"),
    ],
)
def test_an_argument_or_variable_naming_a_path_outside_the_folder_stops_the_check(
    tmp_path: Path, arguments: list[str], variables: dict[str, str], named: str
) -> None:
    outside = tmp_path / "outside"
    log = write(outside, "log.txt", "the user's log\n")
    fill = {"log": str(log), "outside": str(outside)}
    folder = tmp_path / "project"
    write(folder, "train.py", "open('ran.txt', 'w').write('ran')\n")
    env = environment(tmp_path, **{k: v.format(**fill) for k, v in variables.items()})
    done = warm_python.run(graphwatch_command("--check-fixes", "--out", str(tmp_path / "report"), "train.py",
                                              *(a.format(**fill) for a in arguments)),
                           cwd=folder, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2
    assert f"graphwatch: error: --check-fixes: {named.format(**fill)} names a path outside the folder the check copies " \
        f"({folder}), where the patched run could write; run from a folder that holds it, or allow it with " \
        "--check-allow-path PATH" in done.stderr
    assert log.read_text() == "the user's log\n" and sorted(outside.iterdir()) == [log]
    assert not (folder / "ran.txt").exists()


class CheckedRun(NamedTuple):
    """A ``graphwatch run --check-fixes`` of a script in ``folder``, which writes to ``log``."""

    done: subprocess.CompletedProcess[str]
    folder: Path
    log: Path
    before: dict[str, str]  # the folder's digest before the run


@pytest.fixture(scope="module")
def run_with_secrets_and_an_allowed_path(tmp_path_factory: pytest.TempPathFactory) -> CheckedRun:
    """``graphwatch run --check-fixes --check-allow-path OUTSIDE`` of a script that appends to a log in OUTSIDE
    (named by $RUN_LOG) and fails in the copy if a secret of its folder was copied: its run."""
    tmp_path = tmp_path_factory.mktemp("secrets")
    outside = tmp_path / "outside"
    log = write(outside, "log.txt", "")
    folder = tmp_path / "project"
    guard = "import os\nassert not any(os.path.exists(n) for n in ('.env', 'id_rsa', 'server.key')) " \
        "or 'graphwatch-check-' not in os.path.abspath(__file__), 'a secret was copied'\n"
    write(folder, "train.py", guard + "open(os.environ['RUN_LOG'], 'a').write('ran\\n')\n" + KEPT_LOGITS)
    for name in (".env", "id_rsa", "server.key"):
        write(folder, name, "secret\n")
    before = folder_digest(folder)
    done = warm_python.run(graphwatch_command("--check-fixes", "--check-allow-path", str(outside), "--out",
                                              str(tmp_path / "report"), "train.py"),
                           cwd=folder, env=environment(tmp_path, RUN_LOG=str(log)), capture_output=True, text=True,
                           timeout=300)  # fmt: skip
    return CheckedRun(done, folder, log, before)


@pytest.mark.xdist_group("secrets-and-allowed-path")  # (one worker makes the shared run)
def test_an_allowed_path_lets_the_check_run_and_write_there(run_with_secrets_and_an_allowed_path: CheckedRun) -> None:
    done, _, log, _ = run_with_secrets_and_an_allowed_path
    assert done.returncode == 0, done.stderr
    assert "check: checked" in done.stderr
    assert log.read_text() == "ran\nran\n"  # the run and the patched run, as allowed


@pytest.mark.xdist_group("secrets-and-allowed-path")
def test_the_patched_run_gets_no_secret_and_the_user_hears_what_was_left_out(
    run_with_secrets_and_an_allowed_path: CheckedRun,
) -> None:
    done, folder, _, before = run_with_secrets_and_an_allowed_path
    assert done.returncode == 0, done.stderr
    assert "check: checked in " in done.stderr  # (the script's guard raises in a copy that holds a secret)
    assert "(not copied: .env (holds secrets by convention), id_rsa (holds secrets by convention), server.key (holds " \
        "secrets by convention))" in done.stderr
    assert folder_digest(folder) == before


# ------------------------------------------------------------------ hangs and signals
@LINUX
def test_a_patched_run_that_hangs_is_killed_at_its_timeout_with_every_process_it_started(tmp_path: Path) -> None:
    marker = marker_for(tmp_path)
    folder = tmp_path / "project"
    write(folder, "train.py", HANGS_IN_THE_COPY)
    report = tmp_path / "report"
    done = warm_python.run(graphwatch_command("--check-fixes", "--out", str(report), "train.py", marker), cwd=folder,
                           env=environment(tmp_path, GRAPHWATCH_CHECK_TIMEOUT="3"), capture_output=True, text=True,
                           timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "check: FAILED: the patched run wrote no trace: it did not end within 3 s" in done.stderr
    assert processes_with(f"sleep {marker}") == []  # the background sleep went with the patched run
    assert list((tmp_path / "tmpdir").glob("graphwatch-check-*")) == []
    [check] = {id(f.check): f.check for f in graphwatch.load(report / "trace.json").findings if f.check}.values()
    assert not check.checked


@LINUX
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_during_a_check_ends_graphwatch_at_once_with_the_report_written_and_nothing_left(
    tmp_path: Path, signum: int, code: int
) -> None:
    hanging = hanging_check(tmp_path, timeout="600")
    os.kill(hanging.pid, signum)
    done = hanging.ended(10)
    assert done.returncode == code, done.stderr
    assert f"--check-fixes stopped by {'SIGTERM' if signum == signal.SIGTERM else 'Ctrl-C'}" in done.stderr
    trace = graphwatch.load(hanging.report / "trace.json")
    assert (hanging.report / "index.html").is_file() and any(f.patch for f in trace.findings)
    assert processes_with(f"sleep {hanging.marker}") == [] and processes_in(tmp_path / "tmpdir") == []
    assert list((tmp_path / "tmpdir").glob("graphwatch-check-*")) == []


@LINUX
def test_the_report_is_on_disk_before_a_check_starts_and_a_killed_checks_scratch_is_removed_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hanging = hanging_check(tmp_path, timeout="600")
    os.kill(hanging.pid, signal.SIGKILL)  # nothing of graphwatch's runs after it
    assert hanging.ended(60).returncode == -signal.SIGKILL
    for pid in processes_with(str(tmp_path / "tmpdir")):  # the orphaned patched run (a session of its own)
        os.killpg(pid, signal.SIGKILL)
    assert any(f.patch for f in graphwatch.load(hanging.report / "trace.json").findings)
    assert (hanging.report / "index.html").is_file()
    [left] = (tmp_path / "tmpdir").glob("graphwatch-check-*")
    assert left.name.startswith(f"graphwatch-check-{hanging.pid}-")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmpdir"))
    remove_stale_scratch()
    assert list((tmp_path / "tmpdir").glob("graphwatch-check-*")) == []
