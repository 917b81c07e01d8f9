"""Each finding whose fix is one edit of the user's file carries that edit as a unified diff.

For every bundled bug example: run it under graphwatch in a scratch folder,
apply each patch with ``patch -p0`` (the real tool), run the patched script
again under graphwatch, and require a clean run (exit 0, no finding).  The
examples whose fix needs judgement get no patch, and that is checked too.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import warm_python

import graphwatch
from graphwatch.analysis.patches import patch_for
from graphwatch.model import Edit, Finding, Remedy

REPO = Path(graphwatch.__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
BUGS = sorted(p.stem for p in EXAMPLES.glob("*_bug.py"))
# the examples whose fix is one edit graphwatch makes; the others' fixes need the user's judgement
PATCHED = {
    "backward_twice_bug", "gan_bug", "lstm_retain_graph_bug", "loss_list_bug", "missing_zero_grad_bug",
    "multi_loss_retain_bug", "rnn_hidden_bug", "rnn_retain_graph_bug", "shared_graph_bug", "total_loss_bug",
    "validation_no_grad_bug",
}  # fmt: skip

needs_patch_tool = pytest.mark.skipif(shutil.which("patch") is None, reason="needs the patch program")


def graphwatch_run(folder: Path, script: str) -> tuple[subprocess.CompletedProcess[str], graphwatch.Trace]:
    out = folder / "out"
    run = warm_python.run(
        [sys.executable, "-m", "graphwatch", "run", "--out", str(out), script],
        cwd=folder, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return run, graphwatch.load(out / "trace.json")


ExampleRun = Callable[[str], tuple[subprocess.CompletedProcess[str], graphwatch.Trace]]


@pytest.fixture(scope="module")
def example_run(tmp_path_factory: pytest.TempPathFactory) -> ExampleRun:
    """A bundled example run under ``graphwatch run`` in a scratch folder of its own, once for the whole module
    (the examples are seeded: every test that reads the run reads the same one)."""
    runs: dict[str, tuple[subprocess.CompletedProcess[str], graphwatch.Trace]] = {}

    def run(example: str) -> tuple[subprocess.CompletedProcess[str], graphwatch.Trace]:
        if example not in runs:
            folder = tmp_path_factory.mktemp(example)
            shutil.copy(EXAMPLES / f"{example}.py", folder)
            runs[example] = graphwatch_run(folder, f"{example}.py")
        return runs[example]

    return run


def apply_patch(folder: Path, patch: str) -> None:
    """Apply ``patch`` in ``folder`` with the real ``patch -p0``, as the user would."""
    applied = subprocess.run(["patch", "-p0"], input=patch, cwd=folder, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stdout + applied.stderr


@needs_patch_tool
@pytest.mark.parametrize("example", BUGS)
def test_a_bug_examples_patch_applies_and_the_patched_script_runs_clean(
    example: str, tmp_path: Path, example_run: ExampleRun
) -> None:  # fmt: skip
    script = f"{example}.py"
    shutil.copy(EXAMPLES / script, tmp_path / script)
    _, trace = example_run(example)
    patches = list(dict.fromkeys(f.patch for f in trace.findings if f.patch))
    assert trace.findings, "the bug example gave no finding"
    if example not in PATCHED:
        assert patches == [], f"a patch for a fix that needs judgement:\n{patches[0]}"
        return
    assert patches, "no patch for a fix that is one edit"
    for patch in patches:
        apply_patch(tmp_path, patch)
    run, patched = graphwatch_run(tmp_path, script)
    assert run.returncode == 0, run.stderr
    assert patched.findings == [], [f"{f.kind}: {f.message}" for f in patched.findings]


def test_the_patch_is_in_the_summary_and_the_trace(example_run: ExampleRun) -> None:
    run, trace = example_run("total_loss_bug")
    finding = next(f for f in trace.findings if f.kind == "graph-kept-alive")
    assert finding.patch is not None and "+        total_loss += loss.item()  # graphwatch: kept" in finding.patch
    assert "patch (patch -p0):" in run.stderr and "-        total_loss += loss  # graphwatch: kept" in run.stderr


def test_no_patch_where_the_line_no_longer_holds_what_ran_or_the_fix_needs_judgement(tmp_path: Path) -> None:
    """The patch is made from the remedy's edits on the file's tree: a statement over two lines is edited as
    one, a line that does not hold the edit's expression (or a file that changed) gives no patch, and a
    remedy that is not mechanical gives none either."""
    source = tmp_path / "train.py"
    source.write_text("import torch\nlosses = []\nlosses.append(\n    torch.ones(1))\n")
    remedy = Remedy("keep a number", [Edit("item", "train.py", 3, "loss")], mechanical=True)
    finding = Finding("graph-kept-alive", "warning", 3, "m", remedy.text, remedies=[remedy])
    assert patch_for(finding, str(tmp_path)) is None  # line 3 keeps `torch.ones(1)`, not `loss`
    remedy.edits[0].target = "torch.ones(1)"
    assert "+    torch.ones(1).item())\n" in (patch_for(finding, str(tmp_path)) or "")
    remedy.mechanical = False
    assert patch_for(finding, str(tmp_path)) is None
    remedy.mechanical = True
    source.write_text("x = 1\n")
    assert patch_for(finding, str(tmp_path)) is None  # the file no longer holds that statement


EVALUATION_LOOP = """\
import torch
from torch import nn
from torch.nn import functional as F


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    val_batches = [(torch.randn(32, 16), torch.randn(32, 1)) for _ in range(3)]
    history = []
    for epoch in range(6):
        for _ in range(2):
            x, y = torch.randn(32, 16), torch.randn(32, 1)
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        for xv, yv in val_batches:  # the evaluation loop
            out = model(xv)
            history.append(F.mse_loss(out, yv))
    print(f"{min(v.item() for v in history):.3f}")


if __name__ == "__main__":
    main()
"""


@needs_patch_tool
def test_an_evaluation_loop_goes_under_no_grad_whole_and_re_indented(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(EVALUATION_LOOP)
    _, trace = graphwatch_run(tmp_path, "train.py")
    (patch,) = {f.patch for f in trace.findings if f.patch}
    assert "+        with torch.no_grad():\n+            for xv, yv in val_batches:  # the evaluation loop\n" in patch
    assert "+                out = model(xv)\n+                history.append(F.mse_loss(out, yv))\n" in patch
    apply_patch(tmp_path, patch)
    run, patched = graphwatch_run(tmp_path, "train.py")
    assert run.returncode == 0 and patched.findings == [], run.stderr


@needs_patch_tool
def test_a_loop_that_may_train_keeps_its_body_and_only_the_forward_goes_under_no_grad(tmp_path: Path) -> None:
    """A call of a function the file defines could train: the loop is not wrapped, the forward line is."""
    source = EVALUATION_LOOP.replace("            out = model(xv)\n", "            out = model(xv)\n            log(out)\n")
    source = source.replace("def main() -> None:", "def log(value: torch.Tensor) -> None:\n    pass\n\n\ndef main() -> None:")
    (tmp_path / "train.py").write_text(source)
    _, trace = graphwatch_run(tmp_path, "train.py")
    (patch,) = {f.patch for f in trace.findings if f.patch}
    assert "-            out = model(xv)\n+            with torch.no_grad():\n+                out = model(xv)\n" in patch
    added = [line for line in patch.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert len(added) == 2  # the with line and the forward, nothing else moved
    apply_patch(tmp_path, patch)
    run, patched = graphwatch_run(tmp_path, "train.py")
    assert run.returncode == 0 and patched.findings == [], run.stderr


@needs_patch_tool
def test_a_script_outside_the_run_folder_gets_a_patch_that_says_where_to_apply_it(tmp_path: Path) -> None:
    scripts, elsewhere = tmp_path / "scripts", tmp_path / "elsewhere"
    scripts.mkdir()
    elsewhere.mkdir()
    shutil.copy(EXAMPLES / "total_loss_bug.py", scripts / "total_loss_bug.py")
    _, trace = graphwatch_run(elsewhere, str(scripts / "total_loss_bug.py"))
    (patch,) = {f.patch for f in trace.findings if f.patch}
    assert patch.startswith(f"# in {scripts}: patch -p0\n--- total_loss_bug.py\n+++ total_loss_bug.py\n")
    applied = subprocess.run(["patch", "-p0", "-d", str(scripts)], input=patch, cwd=elsewhere, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "total_loss += loss.item()" in (scripts / "total_loss_bug.py").read_text()
