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
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

import graphwatch

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
    run = subprocess.run(
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
    again = subprocess.run(
        [sys.executable, "-m", "graphwatch", "run", "--strict", "--out", "out2", "train.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert again.returncode == 0 and "no graph leaks" in again.stderr, again.stderr


def test_patch_out_into_a_folder_that_cannot_be_written_stops_before_the_script_runs(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('the script ran')\n")
    run = subprocess.run(
        [sys.executable, "-m", "graphwatch", "run", "--patch-out", "/dev/null/fixes.patch", "train.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 2 and "the script ran" not in run.stdout
    assert "cannot write the patches to /dev/null/fixes.patch" in run.stderr


def test_a_run_without_patches_says_so_in_the_file(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("import torch\nx = torch.ones(2, requires_grad=True)\n(x * x).sum().backward()\n")
    run = subprocess.run(
        [sys.executable, "-m", "graphwatch", "run", "--patch-out", "fixes.patch", "--out", "out", "train.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "fixes.patch").read_text().startswith("# graphwatch: no patches")
    assert f"patches: {tmp_path / 'fixes.patch'}" in run.stderr
