"""A printed patch can be applied: in a real terminal (a pseudo-terminal, where the findings are drawn in a box)
the patch is printed outside the box, exactly as it is, so the whole output piped into ``patch -p0`` applies it;
``graphwatch run --patch-out FILE`` writes every patch of a run into one file that ``patch -p0`` applies."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import shutil
import stat
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
import warm_python

import graphwatch
from graphwatch.patch_out import check_patch_out

REPO = Path(graphwatch.__file__).resolve().parents[2]
needs_patch_tool = pytest.mark.skipif(shutil.which("patch") is None, reason="needs the patch program")

# Two findings patch one file, in lines that meet: the retained graph's patch changes the line the missing
# zero_grad()'s patch inserts before (so the two diffs, each of the original, do not apply one after the other).
TWO_FIXES = """\
import torch


def main():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    total_loss = 0
    for step in range(8):
        loss = model(torch.randn(16, 8)).pow(2).mean()
        loss.backward(retain_graph=True)
        opt.step()
        total_loss += loss
    print(float(total_loss))


main()
"""


def run_in_terminal(args: list[str], cwd: Path, columns: int = 60, timeout: float = 300) -> str:
    """Run ``args`` with stdin, stdout and stderr on a new pseudo-terminal ``columns`` wide; return everything it
    wrote, as a terminal shows it (the terminal's ``\\r\\n`` line ends as ``\\n``)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "COLUMNS", "LINES")}
    env.update(TERM="xterm-256color", PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    process = subprocess.Popen(args, cwd=cwd, env=env, stdin=follower, stdout=follower, stderr=follower)
    os.close(follower)
    output = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([leader], [], [], 0.2)[0]:
                try:
                    data = os.read(leader, 65536)
                except OSError:  # the terminal closed: every process on it has exited
                    break
                if not data:
                    break
                output += data
            elif process.poll() is not None:
                break
        process.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if process.poll() is None:
            process.kill()
        os.close(leader)
    return output.decode("utf-8", "replace").replace("\r\n", "\n")


def displayed(written: str) -> str:
    """What a terminal shows of ``written``: no escape sequences (colours, cursor moves), and of a line rewritten
    after a carriage return (the progress line) only its last text."""
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", written)
    return "\n".join(line.rsplit("\r", 1)[-1] for line in plain.split("\n"))


@needs_patch_tool
def test_a_patch_printed_in_a_terminal_applies_with_patch_p0(tmp_path: Path) -> None:
    """The issue: in a terminal the findings are in a box, and a patch inside it is "garbage" to ``patch``."""
    ran, fresh = tmp_path / "ran", tmp_path / "fresh"
    for folder in (ran, fresh):
        folder.mkdir()
        shutil.copy(REPO / "examples" / "total_loss_bug.py", folder)
    written = run_in_terminal([sys.executable, "-m", "graphwatch", "run", "--out", "out", "total_loss_bug.py"], ran)
    patch = next(f.patch for f in graphwatch.load(ran / "out" / "trace.json").findings if f.patch)
    assert patch in written, "the patch is not printed byte for byte (no colour, box, indent or wrapping)"
    shown = displayed(written)
    assert "╭" in shown and "│" in shown and "\x1b[" in written, "no box, no colour: not a terminal's summary"
    assert "patch: 1, printed below" in shown
    diff = shown[shown.index("--- total_loss_bug.py") :]
    assert "│" not in diff.split("\n\n")[0], "the patch is still inside the box"
    applied = subprocess.run(["patch", "-p0"], input=shown, cwd=fresh, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    patched = (fresh / "total_loss_bug.py").read_text()
    assert "total_loss += loss.item()  # graphwatch: kept" in patched
    assert patched != (REPO / "examples" / "total_loss_bug.py").read_text()


@needs_patch_tool
def test_patch_out_writes_every_patch_of_a_run_as_one_file_that_patch_p0_applies(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TWO_FIXES)
    run = warm_python.run(
        [sys.executable, "-m", "graphwatch", "run", "--quiet", "--patch-out", "fixes.patch", "--out", "out",
         "train.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stderr == "", "--quiet: nothing but errors"
    trace = graphwatch.load(tmp_path / "out" / "trace.json")
    patches = {f.kind for f in trace.findings if f.patch}
    assert {"retained-graph", "missing-zero-grad", "graph-kept-alive"} <= patches
    written = (tmp_path / "fixes.patch").read_text()
    assert written.startswith(f"# graphwatch: {len(patches)} patches of 1 file;") and "left out" not in written
    for patch in (f.patch for f in trace.findings if f.patch):  # each alone does not apply after another
        assert patch not in written
    applied = subprocess.run(["patch", "-p0", "-i", "fixes.patch"], cwd=tmp_path, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    source = (tmp_path / "train.py").read_text()
    assert "opt.zero_grad()\n        loss.backward()\n" in source and "total_loss += loss.item()" in source
    again = warm_python.run(
        [sys.executable, "-m", "graphwatch", "run", "--strict", "--out", "out2", "train.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert again.returncode == 0 and "no graph leaks" in again.stderr, again.stderr


def test_patch_out_into_a_folder_that_cannot_be_written_stops_before_the_script_runs(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('the script ran')\n")
    run = warm_python.run(
        [sys.executable, "-m", "graphwatch", "run", "--patch-out", "/dev/null/fixes.patch", "train.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 2 and "the script ran" not in run.stdout
    assert "cannot write the patches to /dev/null/fixes.patch" in run.stderr


def test_a_run_with_no_finding_says_there_was_nothing_to_patch(tmp_path: Path) -> None:
    """Issue 41: the file said "no finding's fix is one edit graphwatch can make safely" of a run with no finding."""
    (tmp_path / "train.py").write_text("import torch\nx = torch.ones(2, requires_grad=True)\n(x * x).sum().backward()\n")
    run = warm_python.run(
        [sys.executable, "-m", "graphwatch", "run", "--patch-out", "fixes.patch", "--out", "out", "train.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert not graphwatch.load(tmp_path / "out" / "trace.json").findings
    assert (tmp_path / "fixes.patch").read_text() == "# graphwatch: nothing to patch: the run had no finding\n"
    assert f"patches: {tmp_path / 'fixes.patch'}" in run.stderr


# ------------------------------------------------------------------ what --patch-out FILE may name (issue 40)
MARKS_ITS_RUN = "import pathlib\npathlib.Path('the-script-ran').write_text('yes')\n"


def graphwatch_run(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return warm_python.run([sys.executable, "-m", "graphwatch", "run", *args], cwd=folder, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"})  # fmt: skip


def test_patch_out_naming_the_script_being_run_is_refused_before_it_runs(tmp_path: Path) -> None:
    """It overwrote the script with the diff, silently, exit 0.  A hard link to the script is the script too."""
    (tmp_path / "train.py").write_text(MARKS_ITS_RUN)
    os.link(tmp_path / "train.py", tmp_path / "same-file.py")
    for name in ("train.py", str(tmp_path / "train.py"), "same-file.py"):
        run = graphwatch_run(tmp_path, "--patch-out", name, "--out", "out", "train.py")
        assert run.returncode == 2, run.stderr
        assert f"graphwatch: error: cannot write the patches to {name}: it is the script graphwatch runs" in run.stderr
        assert (tmp_path / "train.py").read_text() == MARKS_ITS_RUN
        assert not (tmp_path / "the-script-ran").exists() and not (tmp_path / "out").exists()


def _char_device(path: Path) -> None:
    """A character device like /dev/null (major 1, minor 3), made at ``path``; the test is skipped where it cannot
    be (not root)."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, AttributeError):
        pytest.skip("making a character device needs root")


@pytest.mark.parametrize("kind", ["character device", "FIFO", "folder"])
def test_patch_out_naming_what_is_not_a_regular_file_is_refused_and_left_as_it_is(tmp_path: Path, kind: str) -> None:
    """The write renamed a temporary file over it: as root, --patch-out /dev/null replaced /dev/null."""
    (tmp_path / "train.py").write_text(MARKS_ITS_RUN)
    target = tmp_path / "target"
    {"character device": _char_device, "FIFO": os.mkfifo, "folder": os.mkdir}[kind](target)
    before = target.lstat()
    run = graphwatch_run(tmp_path, "--patch-out", "target", "train.py")
    assert run.returncode == 2, run.stderr
    assert f"cannot write the patches to target: it is a {kind}, not a regular file" in run.stderr
    after = target.lstat()
    assert (after.st_mode, after.st_ino, after.st_rdev) == (before.st_mode, before.st_ino, before.st_rdev)
    assert not (tmp_path / "the-script-ran").exists()


def test_dev_null_is_refused_by_the_check_made_before_the_script_runs(tmp_path: Path) -> None:
    """/dev/null itself, in the check alone (which writes nothing): never risk replacing this machine's."""
    before = os.stat("/dev/null")
    with pytest.raises(graphwatch.UsageError, match=r"^cannot write the patches to /dev/null: it is a character device"):
        check_patch_out("/dev/null", script=tmp_path / "train.py")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode) and os.stat("/dev/null").st_ino == before.st_ino


def test_patch_out_naming_a_link_is_refused_and_neither_the_link_nor_its_target_changes(tmp_path: Path) -> None:
    """Renaming over a link replaced the link (as --patch-out /dev/stdout would): graphwatch refuses a link."""
    (tmp_path / "train.py").write_text(MARKS_ITS_RUN)
    (tmp_path / "target.txt").write_text("kept\n")
    (tmp_path / "fixes.patch").symlink_to("target.txt")
    run = graphwatch_run(tmp_path, "--patch-out", "fixes.patch", "train.py")
    assert run.returncode == 2, run.stderr
    assert "cannot write the patches to fixes.patch: it is a symbolic link (to target.txt); graphwatch does not " \
        "write through links" in run.stderr
    assert os.readlink(tmp_path / "fixes.patch") == "target.txt" and (tmp_path / "target.txt").read_text() == "kept\n"
    assert not (tmp_path / "the-script-ran").exists()


HELPER = TWO_FIXES.replace("def main():", "def train():").replace("\n\nmain()\n", "\n")


def test_patch_out_naming_a_file_the_patches_change_is_refused_when_the_run_ends(tmp_path: Path) -> None:
    """Not the script but the module it imports, whose lines the findings cite and the patches change: known only
    when the run ends.  Nothing is written, the report is, and the exit code is 2 (the script succeeded)."""
    (tmp_path / "helper.py").write_text(HELPER)
    (tmp_path / "train.py").write_text("import helper\nhelper.train()\n")
    run = graphwatch_run(tmp_path, "--quiet", "--patch-out", "helper.py", "--out", "out", "train.py")
    assert run.returncode == 2, run.stderr
    assert f"cannot write the patches to {tmp_path / 'helper.py'}: it is a file the patches change; nothing was " \
        "written there; the patches are still in the report" in run.stderr
    assert (tmp_path / "helper.py").read_text() == HELPER
    trace = graphwatch.load(tmp_path / "out" / "trace.json")
    assert any(f.patch and "--- helper.py" in f.patch for f in trace.findings)
    assert any(lines.file == "helper.py" for lines in trace.sources)
