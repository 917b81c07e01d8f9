"""graphwatch's own patch on real third-party training scripts with a one-line bug: it applies with
``patch -p0``, and the patched script trains like the upstream original (the same printed losses).

The scripts are not in this repository: ``GRAPHWATCH_CORPUS`` names the folder that holds them, laid out
as ``benchmarks/accuracy/cases.py`` says (``<owner>+<name>/<folder>`` at the case's commit); without it
these tests are skipped.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_patches import REPO, apply_patch, needs_patch_tool

import graphwatch

CORPUS = os.environ.get("GRAPHWATCH_CORPUS")
pytestmark = [
    needs_patch_tool,
    pytest.mark.skipif(not CORPUS, reason="GRAPHWATCH_CORPUS (the third-party scripts) is not set"),
]
sys.path.insert(0, str(REPO / "benchmarks" / "accuracy"))
from cases import WLM, WLM_ARGS  # noqa: E402
from run import SETUPS  # noqa: E402

REPACKAGE = "\n            hidden = repackage_hidden(hidden)\n"  # in train(); evaluate() keeps its own
TIMINGS = re.compile(r"ms/batch\s+[\d.]+|time:\s+[\d.]+s")


def _losses(folder: Path, script: str, *args: str) -> str:
    done = subprocess.run([sys.executable, script, *args], cwd=folder, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return TIMINGS.sub("", done.stdout)


def test_word_language_model_without_repackage_hidden_is_patched_to_train_like_upstream(tmp_path: Path) -> None:
    upstream = Path(CORPUS or "") / WLM.repo.replace("/", "+") / WLM.folder
    if not upstream.is_dir():
        pytest.skip(f"{upstream} is not there")
    folder = tmp_path / "wlm"
    shutil.copytree(upstream, folder)
    SETUPS["wikitext"](folder)
    args = (*WLM_ARGS, "--log-interval", "5")
    script = folder / WLM.script
    shutil.copy(script, folder / "upstream.py")
    source = script.read_text()
    assert source.count(REPACKAGE) == 1
    script.write_text(source.replace(REPACKAGE, "\n"))  # the bug: the hidden state is never cut

    run = subprocess.run(
        [sys.executable, "-m", "graphwatch", "run", "--out", "out", WLM.script, *args],
        cwd=folder, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode != 0 and "backward through the graph a second time" in run.stderr
    findings = graphwatch.load(folder / "out" / "trace.json").findings
    carried = next(f for f in findings if f.kind == "graph-carried-across-steps")
    assert carried.fix.startswith("`hidden = tuple(h.detach() for h in hidden)` at the start of each step")
    assert {f.patch for f in findings if f.patch} == {carried.patch}
    assert "+            hidden = tuple(h.detach() for h in hidden)\n             output, hidden = model(" in (carried.patch or "")
    apply_patch(folder, carried.patch or "")
    assert _losses(folder, WLM.script, *args) == _losses(folder, "upstream.py", *args)
    assert _losses(folder, WLM.script, *args, "--use-optimizer") == _losses(folder, "upstream.py", *args, "--use-optimizer")
