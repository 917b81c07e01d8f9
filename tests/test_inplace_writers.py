"""torch's "modified by an inplace operation" error, for every in-place form, under ``graphwatch run``: a
``modified-in-place`` finding names the line(s) that changed the saved tensor (issue 38, point 1), and its fix
keeps what the program computes: the out-of-place form as a patch where it is one mechanical edit (the patched
program prints what the hand-fixed one prints), words for a recurrence written into one tensor (never a
``.clone()`` before the loop) and for an optimizer step that ran before a backward needing its parameters.
Correct programs that look alike (a ResNet block, outputs written into a buffer) stay silent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import warm_python
from test_patches import apply_patch, graphwatch_run, needs_patch_tool

import graphwatch
from graphwatch.model import Finding

LOOP = """
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    x = torch.randn(4, 8)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.6f}")
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in model.parameters()))
"""

RESIDUAL = """\
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        residual = x
        out = torch.relu(self.fc1(x))
        h = self.fc2(out)  # at: saved
        out += residual  # at: write
        return h + out


torch.manual_seed(0)
model = Block()
""" + LOOP

BORDER = """\
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        att = (self.q(x) @ self.k(x).transpose(-2, -1)).softmax(-1)  # at: saved
        att[0, :] = 0  # at: top
        att[-1, :] = 0  # at: bottom
        att[:, 0] = 0  # at: left
        att[:, -1] = 0  # at: right
        return att @ x


torch.manual_seed(0)
model = Attention()
""" + LOOP

MASKED = """\
import torch
from torch import nn


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        scores = torch.exp(self.fc(x))  # at: saved
        scores.masked_fill_(x > 0, 0.0)  # at: write
        return scores


torch.manual_seed(0)
model = Gate()
""" + LOOP

RELU_MODULE = """\
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(
    nn.Linear(8, 8),
    nn.Sigmoid(),
    nn.ReLU(inplace=True),  # at: write
    nn.Linear(8, 1),
)
""" + LOOP

RELU_FUNCTIONAL = """\
import torch
import torch.nn.functional as F
from torch import nn


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = torch.sigmoid(self.fc(x))
        return F.relu(y, inplace=True)  # at: write


torch.manual_seed(0)
model = Gate()
""" + LOOP

RECURRENCE = """\
import torch
from torch import nn

torch.manual_seed(0)
cell = nn.Linear(8, 8)
opt = torch.optim.SGD(cell.parameters(), lr=0.1)
for step in range(2):
    x = torch.randn(4, 8)
    h = x.new_zeros(4, 6, 8)
    h[:, 0] = x
    for t in range(5):  # at: loop
        h[:, t + 1] = torch.tanh(cell(h[:, t]))  # at: write
    loss = h.pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

CLONED_RECURRENCE = RECURRENCE.replace("    h[:, 0] = x\n", "    h[:, 0] = x\n    h = h.clone()\n")

ACTOR_CRITIC = """\
import torch
from torch import nn

torch.manual_seed(0)
actor = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
critic = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
actor_opt = torch.optim.SGD(actor.parameters(), lr=0.01)
critic_opt = torch.optim.SGD(critic.parameters(), lr=0.01)
for step in range(2):
    states, actions, returns = torch.randn(16, 4), torch.randn(16, 2), torch.randn(16, 1)
    critic_loss = (critic(torch.cat([states, actions], 1)) - returns).pow(2).mean()
    actor_loss = -critic(torch.cat([states, actor(states)], 1)).mean()  # at: saved
    critic_opt.zero_grad()
    critic_loss.backward()
    critic_opt.step()  # at: step
    actor_opt.zero_grad()
    actor_loss.backward()  # at: backward
    actor_opt.step()
"""

RESNET_BLOCK = """\
import torch
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.bn1 = nn.Linear(8, 8), nn.BatchNorm1d(8)
        self.relu = nn.ReLU(inplace=True)
        self.fc2, self.bn2 = nn.Linear(8, 8), nn.BatchNorm1d(8)

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.fc1(x)))
        out = self.bn2(self.fc2(out))
        out += identity
        return self.relu(out)


torch.manual_seed(0)
model = BasicBlock()
""" + LOOP

OUTPUT_BUFFER = """\
import torch
from torch import nn

torch.manual_seed(0)
cell = nn.Linear(8, 8)
opt = torch.optim.SGD(cell.parameters(), lr=0.1)
for step in range(2):
    h = torch.randn(4, 8)
    out = h.new_zeros(4, 5, 8)
    for t in range(5):
        h = torch.tanh(cell(h))
        out[:, t] = h
    loss = out.pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def line(source: str, tag: str) -> int:
    [number] = [n for n, text in enumerate(source.splitlines(), 1) if text.endswith(f"# at: {tag}")]
    return number


def where(source: str, *tags: str) -> list[str]:
    return [f"bug.py:{line(source, tag)}" for tag in tags]


def inplace_run(tmp_path: Path, source: str) -> tuple[subprocess.CompletedProcess[str], Finding]:
    """``graphwatch run bug.py``: torch's error, and the one ``modified-in-place`` finding the trace keeps."""
    (tmp_path / "bug.py").write_text(source)
    run, trace = graphwatch_run(tmp_path, "bug.py")
    assert run.returncode == 1 and "modified by an inplace operation" in run.stderr, run.stderr
    [finding] = trace.findings
    assert finding.kind == "modified-in-place" and finding.message in run.stderr
    return run, finding


def changed_lines(finding: Finding) -> list[str]:
    """The lines the finding says changed the saved tensor, as ``file:line`` (the file's name only)."""
    evidence = finding.evidence
    return [Path(w).name for w in [evidence["changed_at"], *evidence["changed_also"]] if w]


def patched_prints_as_fixed(tmp_path: Path, finding: Finding, fixed: str) -> None:
    """The finding's patch applied to bug.py: it runs and prints what the hand-fixed program prints."""
    assert finding.patch is not None
    apply_patch(tmp_path, finding.patch)
    (tmp_path / "fixed.py").write_text(fixed)
    patched, by_hand = (warm_python.run([sys.executable, name], cwd=tmp_path, capture_output=True, text=True,
                                        timeout=300) for name in ("bug.py", "fixed.py"))  # fmt: skip
    assert patched.returncode == by_hand.returncode == 0, patched.stderr + by_hand.stderr
    assert patched.stdout == by_hand.stdout and "trained:" in patched.stdout


@needs_patch_tool
def test_an_augmented_assignment_on_a_saved_relu_output_is_named_and_made_out_of_place(tmp_path: Path) -> None:
    _, finding = inplace_run(tmp_path, RESIDUAL)
    assert changed_lines(finding) == where(RESIDUAL, "write")
    assert Path(finding.evidence["saved_at"]).name == where(RESIDUAL, "saved")[0]
    assert "could not tell" not in finding.message
    patched_prints_as_fixed(tmp_path, finding, RESIDUAL.replace("out += residual", "out = out + residual"))


@needs_patch_tool
def test_four_index_assignments_are_all_named_and_one_clone_before_the_first_fixes_them(tmp_path: Path) -> None:
    run, finding = inplace_run(tmp_path, BORDER)
    assert changed_lines(finding) == where(BORDER, "top", "bottom", "left", "right")
    assert f"then changed in place at {where(BORDER, 'top')[0]} (`att[0, :] = 0" in run.stderr
    assert f"and {where(BORDER, 'right')[0]} (`att[:, -1] = 0" in run.stderr
    fixed = BORDER.replace("        att[0, :] = 0", "        att = att.clone()\n        att[0, :] = 0")
    patched_prints_as_fixed(tmp_path, finding, fixed)


@needs_patch_tool
def test_a_masked_fill_method_is_named_and_made_out_of_place(tmp_path: Path) -> None:
    _, finding = inplace_run(tmp_path, MASKED)
    assert changed_lines(finding) == where(MASKED, "write")
    fixed = MASKED.replace("scores.masked_fill_(x > 0, 0.0)", "scores = scores.masked_fill(x > 0, 0.0)")
    patched_prints_as_fixed(tmp_path, finding, fixed)


@needs_patch_tool
def test_a_relu_module_built_inplace_after_a_sigmoid_is_patched_where_it_is_built(tmp_path: Path) -> None:
    _, finding = inplace_run(tmp_path, RELU_MODULE)
    assert Path(finding.evidence["built_at"]).name == where(RELU_MODULE, "write")[0]
    patched_prints_as_fixed(tmp_path, finding, RELU_MODULE.replace("inplace=True", "inplace=False"))


@needs_patch_tool
def test_a_functional_relu_inplace_after_a_sigmoid_is_named_and_patched(tmp_path: Path) -> None:
    _, finding = inplace_run(tmp_path, RELU_FUNCTIONAL)
    assert changed_lines(finding) == where(RELU_FUNCTIONAL, "write")
    patched_prints_as_fixed(tmp_path, finding, RELU_FUNCTIONAL.replace("inplace=True", "inplace=False"))


@pytest.mark.parametrize("source", [RECURRENCE, CLONED_RECURRENCE], ids=["preallocated", "cloned-before-the-loop"])
def test_a_recurrence_into_one_tensor_is_told_to_stack_a_list_never_to_clone(tmp_path: Path, source: str) -> None:
    run, finding = inplace_run(tmp_path, source)
    assert changed_lines(finding) == where(source, "write")
    assert f"one slice per step of the loop at {where(source, 'loop')[0]}" in run.stderr
    assert "keep the states in a list" in finding.fix and "`torch.stack`" in finding.fix
    assert "A `.clone()` of `h` before the loop does not help" in finding.fix
    assert finding.patch is None and not any(r.edits for r in finding.remedies)


def test_an_optimizer_step_before_a_backward_that_needs_its_parameters_is_a_finding(tmp_path: Path) -> None:
    run, finding = inplace_run(tmp_path, ACTOR_CRITIC)
    step, backward = where(ACTOR_CRITIC, "step", "backward")
    assert f"optimizer.step() at {step} updated this parameter in place" in run.stderr
    assert f"`actor_loss.backward()  # at: backward` at {backward} above `critic_opt.step()  # at: step` at {step}" \
        in finding.fix
    assert Path(finding.evidence["optimizer_at"]).name == step
    assert finding.patch is None and "no graph leaks" not in run.stderr


@pytest.mark.parametrize("source", [RESNET_BLOCK, OUTPUT_BUFFER], ids=["resnet-block", "output-buffer"])
def test_in_place_writes_that_touch_nothing_saved_stay_silent(tmp_path: Path, source: str) -> None:
    (tmp_path / "ok.py").write_text(source)
    run, trace = graphwatch_run(tmp_path, "ok.py")
    assert run.returncode == 0, run.stderr
    assert trace.findings == [] and isinstance(trace, graphwatch.Trace)


HELPER = """\
import torch
from torch import nn


def normalize_(t):
    t.sub_(t.mean(dim=1, keepdim=True))  # at: write
    return t


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return torch.exp(self.fc(x))  # at: saved


torch.manual_seed(0)
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    h = model(torch.randn(4, 8))
    normalize_(h)  # at: call
    loss = h.pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

OPS = """\
def scale_(t, by):
    view = t.t()
    view.mul_(by)  # at: write
"""

HELPER_IN_ANOTHER_MODULE = """\
import torch
from torch import nn

import ops


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = torch.sigmoid(self.fc(x))  # at: saved
        ops.scale_(h, 0.5)  # at: call
        return h


torch.manual_seed(0)
model = Net()
""" + LOOP

# a writing op that saves its result (``exp_``) in a helper called twice: the second call changes what the first saved
HELPER_TWICE = HELPER.replace("t.sub_(t.mean(dim=1, keepdim=True))", "t.exp_()").replace(
    "torch.exp(self.fc(x))", "torch.sigmoid(self.fc(x))").replace(
    "    normalize_(h)  # at: call\n", "    normalize_(h)  # at: first\n    normalize_(h)  # at: call\n")

VIEW_WRITE = """\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = torch.exp(self.fc(x))  # at: saved
        ht = h.t()
        z = self.fc(x)
        z.mul_(2)
        ht.mul_(0.5)  # at: write
        return h + z


torch.manual_seed(0)
model = Net()
""" + LOOP


def test_a_helper_function_writing_the_saved_tensor_is_named_with_the_call_that_ran_it(tmp_path: Path) -> None:
    run, finding = inplace_run(tmp_path, HELPER)
    assert changed_lines(finding) == where(HELPER, "write")
    assert Path(finding.evidence["called_at"]).name == where(HELPER, "call")[0]
    assert f"in the function called at {where(HELPER, 'call')[0]} (`normalize_(h)" in run.stderr
    assert "`.clone()` the tensor and assign the clone to the caller's name before the call" in finding.fix
    assert finding.patch is None  # `t = t.sub(...)` in the helper would leave the caller's `h` unchanged


def test_a_helper_of_another_module_called_by_the_forward_writing_through_a_view_is_named(tmp_path: Path) -> None:
    (tmp_path / "ops.py").write_text(OPS)
    _, finding = inplace_run(tmp_path, HELPER_IN_ANOTHER_MODULE)
    assert changed_lines(finding) == [f"ops.py:{line(OPS, 'write')}"]
    assert Path(finding.evidence["called_at"]).name == where(HELPER_IN_ANOTHER_MODULE, "call")[0]
    assert finding.patch is None


def test_a_writing_op_that_saves_its_result_in_a_helper_called_twice_is_named_once(tmp_path: Path) -> None:
    _, finding = inplace_run(tmp_path, HELPER_TWICE)
    write, first, second = where(HELPER_TWICE, "write", "first", "call")
    assert changed_lines(finding) == [write] and finding.evidence["changed_also"] == []
    assert f"saved at {write} (`t.exp_()  # at: write`), in the function called at {first}" in finding.message
    assert f"in the function called at {second} (`normalize_(h)  # at: call`)" in finding.message
    assert finding.message.count(f"changed in place at {write}") == 1 and finding.patch is None


def test_a_write_through_a_view_of_the_saved_tensor_is_named_among_other_in_place_writes(tmp_path: Path) -> None:
    _, finding = inplace_run(tmp_path, VIEW_WRITE)
    assert changed_lines(finding) == where(VIEW_WRITE, "write")
    # `ht = ht.mul(0.5)` would leave `h`, read afterwards, unchanged: words, no patch
    assert finding.patch is None and "changed a view whose base may need the change" in finding.fix
