"""graphwatch's own patch on real third-party training scripts with a one-line bug (the accuracy corpus's
cases): it applies with ``patch -p0``, the patched script runs clean under graphwatch, and where the
upstream script is seeded it trains like the upstream original (the same printed losses).

The scripts are not in this repository: ``GRAPHWATCH_CORPUS`` names the folder that holds them, laid out
as ``benchmarks/accuracy/cases.py`` says (``<owner>+<name>/<folder>`` at the case's commit); without it
these tests are skipped.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import warm_python
from test_patches import REPO, apply_patch, needs_patch_tool

CORPUS = os.environ.get("GRAPHWATCH_CORPUS")
pytestmark = [
    needs_patch_tool,
    pytest.mark.skipif(not CORPUS, reason="GRAPHWATCH_CORPUS (the third-party scripts) is not set"),
]
sys.path.insert(0, str(REPO / "benchmarks" / "accuracy"))
from cases import REAL, Case  # noqa: E402
from run import HERE, _prepare, _run  # noqa: E402

TIMINGS = re.compile(r"ms/batch\s+[\d.]+|time:\s+[\d.]+s")


def case_named(name: str) -> Case:
    return next(case for case in REAL if case.name == name)


def printed(case: Case, script: Path, *more: str) -> str:
    """What the script prints, run plainly (no graphwatch), timings left out."""
    env = dict(os.environ, **case.env, PYTHONPATH=os.pathsep.join([str(HERE / "shims"), str(REPO / "src")]))
    done = warm_python.run([sys.executable, script.name, *case.args, *more], cwd=script.parent, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return TIMINGS.sub("", done.stdout)


def patched(case: Case, tmp_path: Path) -> tuple[Path, list]:
    """The case's mutated script with graphwatch's patches applied, and the findings of its first run."""
    script = _prepare(case, Path(CORPUS or ""), tmp_path / "work")
    if script is None:
        pytest.skip(f"{case.source} is not in {CORPUS}")
    findings = _run(case, script, tmp_path / "out").findings
    patches = list(dict.fromkeys(f.patch for f in findings if f.patch))
    assert len(patches) == 1, [f"{f.kind}: {f.fix}" for f in findings]
    apply_patch(script.parent, patches[0])
    again = _run(case, script, tmp_path / "again")
    assert again.code == 0 and again.findings == [], again.stderr[-2000:]
    return script, findings


@pytest.mark.parametrize(
    "name", ["word-language-model, hidden not repackaged", "word-language-model, not repackaged + retain_graph"]
)
def test_word_language_model_carrying_its_hidden_state_is_patched_to_train_like_upstream(name: str, tmp_path: Path) -> None:
    case = case_named(name)
    (tmp_path / "work").mkdir()
    script, findings = patched(case, tmp_path)
    carried = next(f for f in findings if f.kind == "graph-carried-across-steps")
    assert carried.fix.startswith("`hidden = repackage_hidden(hidden)` at the start of each step")  # its own helper
    upstream = _prepare(replace(case, mutation=()), Path(CORPUS or ""), tmp_path / "upstream")
    assert upstream is not None
    assert printed(case, script) == printed(case, upstream)
    assert printed(case, script, "--use-optimizer") == printed(case, upstream, "--use-optimizer")


def test_wgan_gp_keeping_each_g_loss_in_a_list_is_patched_to_keep_numbers(tmp_path: Path) -> None:
    """The line holds two statements (`g_loss.backward(); losses.append(g_loss)`): the one that keeps it is
    edited.  (Upstream is not seeded: its losses differ run to run, so only a clean run is checked.)"""
    case = case_named("wgan-gp, g_loss appended to a list")
    (tmp_path / "work").mkdir()
    script, findings = patched(case, tmp_path)
    kept = next(f for f in findings if f.kind == "graph-kept-alive")
    assert kept.fix.startswith("keep a number, not the graph: `batches_done_losses.append(g_loss.item())`")
    assert "g_loss.backward(); batches_done_losses.append(g_loss.item())" in script.read_text()
