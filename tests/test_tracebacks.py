"""An error graphwatch raises reads as torch's would: its traceback ends at the user's call into torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import graphwatch

PACKAGE = str(Path(graphwatch.__file__).resolve().parent)

TWICE = """\
    import torch, graphwatch
    x = torch.ones(3, requires_grad=True)
    with graphwatch.watch(summary=False):
        y = (x.exp() * 2).sum()
        y.backward()
        y.backward()  # the second one
    """


def test_a_watch_blocks_backward_twice_traceback_has_no_graphwatch_frame(tmp_path: Path) -> None:
    script = tmp_path / "twice.py"
    script.write_text(textwrap.dedent(TWICE))
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    traceback = run.stderr.split("graphwatch.errors.BackwardTwiceError")[0]
    frames = [line.strip() for line in traceback.splitlines() if line.strip().startswith("File ")]
    assert frames[0].startswith(f'File "{script}", line 6')  # the user's frame: their second backward
    assert not any(PACKAGE in frame for frame in frames), frames
    assert run.stderr.count("Fixes, best first:") == 1
