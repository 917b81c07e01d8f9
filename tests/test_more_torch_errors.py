"""Three more of torch's autograd errors, explained after torch's own message and recorded as findings:
a backward of a loss built with ``reduction='none'`` (``non-scalar-backward``), an input of
``torch.autograd.grad`` the outputs were not computed from (``unused-grad-input``), and a parameter updated in
place outside ``torch.no_grad()`` (``leaf-modified-in-place``, patched).  Each runs as a real script inside
``graphwatch.watch()`` and under ``graphwatch run``; its correct twin gives no finding."""

from __future__ import annotations

import contextlib
import io
import runpy
import sys
from pathlib import Path

import pytest
import warm_python
from test_patches import apply_patch, graphwatch_run, needs_patch_tool

import graphwatch
from graphwatch.model import Finding

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.usefixtures("no_session_left")

NON_SCALAR = """\
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(4, 1)
criterion = nn.MSELoss(reduction='none')  # at: built
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    optimizer.zero_grad()
    loss = criterion(model(x), y)  # at: made
    loss.backward()  # at: backward
    optimizer.step()
"""
WEIGHTED = NON_SCALAR.replace("loss.backward()", "(loss * torch.linspace(0.5, 1.5, 8)[:, None]).mean().backward()")

PENALTY = """\
import torch
from torch import nn

torch.manual_seed(0)
critic = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))
generator = nn.Linear(3, 2)
real, fake = torch.randn(4, 2), generator(torch.randn(4, 3))
alpha = torch.rand(4, 1)
interp = alpha * real + (1 - alpha) * fake.detach()  # at: interp
interp_copy = interp.clone().requires_grad_(True)  # at: copy
d_out = critic(interp)  # at: critic
grads, = torch.autograd.grad(d_out.sum(), interp_copy, create_graph=True)  # at: grad
print(grads.norm())
"""
PENALTY_UNUSED_ALLOWED = PENALTY.replace("create_graph=True)", "create_graph=True, allow_unused=True)")

MANUAL_SGD = """\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x):
        return self.fc(x)


torch.manual_seed(0)
model = Net()
lr = 0.1
for step in range(3):
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    model.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()  # at: backward
    for p in model.parameters():  # at: loop
        p -= lr * p.grad  # at: update
print([round(v, 5) for v in model.fc.weight.flatten().tolist()], round(model.fc.bias.item(), 5))
"""
MANUAL_SGD_FIXED = MANUAL_SGD.replace(
    "    for p in model.parameters():  # at: loop\n        p -= lr * p.grad  # at: update\n",
    "    with torch.no_grad():\n        for p in model.parameters():\n            p -= lr * p.grad\n",
)


def line(source: str, tag: str) -> int:
    [number] = [n for n, text in enumerate(source.splitlines(), 1) if text.endswith(f"# at: {tag}")]
    return number


def bare_error(script: Path) -> str:
    """torch's message, as the script raises it without graphwatch."""
    with pytest.raises(RuntimeError) as raised, contextlib.redirect_stdout(io.StringIO()):
        runpy.run_path(str(script), run_name="__main__")
    return str(raised.value)


def watched(script: Path) -> tuple[str, list[Finding]]:
    """The error the script raises inside a session (leaving it), and the session's findings."""
    with pytest.raises(RuntimeError) as raised, contextlib.redirect_stdout(io.StringIO()):
        with graphwatch.watch(summary=False, snapshots="off") as gw:
            runpy.run_path(str(script), run_name="__main__")
    return str(raised.value), gw.findings


def silent(script: Path) -> list[Finding]:
    """The findings of a script that runs to its end inside a session."""
    with contextlib.redirect_stdout(io.StringIO()), graphwatch.watch(summary=False, snapshots="off") as gw:
        runpy.run_path(str(script), run_name="__main__")
    return gw.findings


def written(tmp_path: Path, name: str, source: str) -> Path:
    script = tmp_path / name
    script.write_text(source)
    return script


def explained(tmp_path: Path, name: str, source: str, kind: str) -> tuple[str, Finding]:
    """The watched error's text (torch's message first and unchanged) and its one finding, of ``kind``."""
    script = written(tmp_path, name, source)
    bare = bare_error(script)
    text, findings = watched(script)
    assert text.startswith(bare + "\n\ngraphwatch: "), f"\nbare:    {bare!r}\nwatched: {text!r}"
    assert [f.kind for f in findings] == [kind]
    assert findings[0].message in text and findings[0].severity == "error"
    return text, findings[0]


def strict_run(tmp_path: Path, name: str, kind: str) -> str:
    """``graphwatch run --strict``: the script fails as without graphwatch, and the summary, the printed error
    and the trace all carry the finding."""
    out = tmp_path / "strict-out"
    run = warm_python.run(
        [sys.executable, "-m", "graphwatch", "run", "--strict", "--out", str(out), name],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 1, run.stderr
    assert "\n\ngraphwatch: " in run.stderr  # (the traceback as Python prints it: torch's message, then ours)
    assert kind in run.stderr  # the summary's findings
    assert [f.kind for f in graphwatch.load(out / "trace.json").findings] == [kind]
    return run.stderr


def test_a_loss_built_with_reduction_none_names_the_criterion_and_offers_a_choice(tmp_path: Path) -> None:
    text, finding = explained(tmp_path, "non_scalar.py", NON_SCALAR, "non-scalar-backward")
    script = tmp_path / "non_scalar.py"
    assert f"`loss` backwarded at {script}:{line(NON_SCALAR, 'backward')} (`loss.backward()" in text
    assert "shape (8, 1)" in text
    assert f"made at {script}:{line(NON_SCALAR, 'made')} (`loss = criterion(model(x), y)" in text
    assert (f"by `criterion`, an nn.MSELoss built with reduction='none' at {script}:{line(NON_SCALAR, 'built')} "
            "(`criterion = nn.MSELoss(reduction='none')") in text  # fmt: skip
    assert "`.mean()` (what the default reduction='mean' does) or `.sum()`" in finding.fix
    assert not any(r.edits for r in finding.remedies) and finding.patch is None  # a choice: no patch


def test_a_non_scalar_backward_is_seen_by_graphwatch_run_strict(tmp_path: Path) -> None:
    written(tmp_path, "non_scalar.py", NON_SCALAR)
    stderr = strict_run(tmp_path, "non_scalar.py", "non-scalar-backward")
    assert "RuntimeError: grad can be implicitly created only for scalar outputs\n\ngraphwatch: `loss`" in stderr
    assert f"non_scalar.py:{line(NON_SCALAR, 'built')} (`criterion = nn.MSELoss(reduction='none')" in stderr


def test_a_reduction_none_loss_weighted_then_averaged_gives_no_finding(tmp_path: Path) -> None:
    assert silent(written(tmp_path, "weighted.py", WEIGHTED)) == []


def test_an_input_the_critic_never_saw_names_it_and_the_tensor_it_saw(tmp_path: Path) -> None:
    text, finding = explained(tmp_path, "penalty.py", PENALTY, "unused-grad-input")
    script = tmp_path / "penalty.py"
    assert f"the `torch.autograd.grad` at {script}:{line(PENALTY, 'grad')}" in text
    assert f"`interp_copy` (made at {script}:{line(PENALTY, 'copy')} (`interp_copy = interp.clone()" in text
    assert f"They were computed from `interp`, of the same shape (4, 2), made at {script}:{line(PENALTY, 'interp')}" in text
    assert f"which the model ran on at {script}:{line(PENALTY, 'critic')} (`d_out = critic(interp)" in text
    assert "run the model on the tensor you differentiate" in finding.fix and "`allow_unused=True` only if" in finding.fix
    assert finding.evidence["input"] == "interp_copy" and finding.evidence["computed_from"] == ["interp"]
    assert not any(r.edits for r in finding.remedies)  # which tensor is meant needs judgement: no patch


def test_an_input_used_by_another_tensor_of_its_shape_offers_to_pass_that_one() -> None:
    """When the tensor the outputs were computed from requires grad, passing it is the first way out."""
    import torch

    x = torch.randn(3, 2, requires_grad=True)
    x_twin = torch.randn(3, 2, requires_grad=True)
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        y = (x * 2).sum()
        with pytest.raises(RuntimeError) as raised:
            torch.autograd.grad(y, [x_twin])
    assert str(raised.value).startswith("The differentiated Tensor at index 0 appears to not have been used")
    assert "`x_twin`" in str(raised.value) and "They were computed from `x`" in str(raised.value)
    assert [f.kind for f in gw.findings] == ["unused-grad-input"]
    assert gw.findings[0].fix.startswith("pass `x`, the tensor the outputs were computed from")


def test_an_unused_input_is_seen_by_graphwatch_run_strict(tmp_path: Path) -> None:
    written(tmp_path, "penalty.py", PENALTY)
    stderr = strict_run(tmp_path, "penalty.py", "unused-grad-input")
    assert "Set allow_unused=True if this is the desired behavior.\n\ngraphwatch: the input of" in stderr


def test_allow_unused_gives_no_finding(tmp_path: Path) -> None:
    assert silent(written(tmp_path, "allowed.py", PENALTY_UNUSED_ALLOWED.replace("print(grads.norm())", ""))) == []


def test_a_parameter_updated_in_place_is_named_as_the_model_holds_it(tmp_path: Path) -> None:
    text, finding = explained(tmp_path, "manual_sgd.py", MANUAL_SGD, "leaf-modified-in-place")
    script = tmp_path / "manual_sgd.py"
    assert (f"the statement at {script}:{line(MANUAL_SGD, 'update')} (`p -= lr * p.grad  # at: update`) changes `p` in place, "
            "and `p` is `model.fc.weight`, a parameter") in text  # fmt: skip
    assert finding.evidence["parameter"] == "model.fc.weight"
    [remedy] = finding.remedies
    assert remedy.patchable and [(e.kind, e.line) for e in remedy.edits] == [("no-grad", line(MANUAL_SGD, "update"))]


@needs_patch_tool
def test_the_manual_sgd_patch_applies_and_trains_like_the_hand_fixed_loop(tmp_path: Path) -> None:
    written(tmp_path, "manual_sgd.py", MANUAL_SGD)
    run, trace = graphwatch_run(tmp_path, "manual_sgd.py")
    assert run.returncode == 1 and "changes `p` in place, and `p` is `model.fc.weight`" in run.stderr
    [finding] = trace.findings
    assert finding.kind == "leaf-modified-in-place" and finding.patch is not None
    assert "+    with torch.no_grad():\n+        for p in model.parameters():" in finding.patch
    apply_patch(tmp_path, finding.patch)
    patched = warm_python.run([sys.executable, "manual_sgd.py"], cwd=tmp_path, capture_output=True, text=True)
    fixed = warm_python.run([sys.executable, "fixed.py"], cwd=written(tmp_path, "fixed.py", MANUAL_SGD_FIXED).parent,
                           capture_output=True, text=True)  # fmt: skip
    assert patched.returncode == fixed.returncode == 0, patched.stderr + fixed.stderr
    assert patched.stdout == fixed.stdout and patched.stdout.startswith("[")


def test_a_leaf_changed_in_place_is_seen_by_graphwatch_run_strict(tmp_path: Path) -> None:
    written(tmp_path, "manual_sgd.py", MANUAL_SGD)
    stderr = strict_run(tmp_path, "manual_sgd.py", "leaf-modified-in-place")
    assert "in-place operation.\n\ngraphwatch: the statement at manual_sgd.py:" in stderr
    assert "patch (patch -p0): the fix of leaf-modified-in-place" in stderr


def test_manual_sgd_under_no_grad_gives_no_finding(tmp_path: Path) -> None:
    assert silent(written(tmp_path, "fixed.py", MANUAL_SGD_FIXED)) == []


def test_the_pytest_marker_shows_the_explained_error_of_a_leaf_changed_in_place(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_sgd="""
import pytest
import torch


@pytest.mark.graphwatch
def test_manual_sgd():
    model = torch.nn.Sequential(torch.nn.Linear(4, 1))
    model(torch.randn(8, 4)).pow(2).mean().backward()
    for p in model.parameters():
        p -= 0.1 * p.grad
""")
    # pytest in a process of its own, as runpytest_subprocess starts it (the plugin loads by its entry point)
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--basetemp={pytester.path / 'tmp'}"]
    done = warm_python.run(args, cwd=pytester.path, capture_output=True, text=True, timeout=300)
    result = pytest.RunResult(done.returncode, done.stdout.splitlines(), done.stderr.splitlines(), duration=0.0)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "E*RuntimeError: a leaf Variable that requires grad is being used in an in-place operation.",
        "E*graphwatch: the statement at *test_sgd.py:10 (`p -= 0.1 * p.grad`) changes `p` in place, and `p` is "
        "`model.0.weight`, a parameter*",
    ])  # fmt: skip
