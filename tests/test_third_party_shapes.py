"""Shapes of training code found wrongly answered on third-party scripts (nanoGPT's gradient accumulation and
GradScaler, makemore's loops, the yunjey and Lightning examples' meters, evaluations and style targets), each
reduced to a few lines: the finding, its line and its fix must be the right ones, and a patch must run.

Each program runs under ``graphwatch run`` in a scratch folder (:func:`test_leak_fixes.diagnose`); a patch is
applied with the real ``patch -p0`` and the patched program runs again, clean, and trains as a known-good fix.
"""

from __future__ import annotations

from pathlib import Path

from test_kept_value_use import HEAD as KEPT_HEAD
from test_leak_fixes import diagnose, finding_of, patched_runs_clean, trains_like
from test_patches import needs_patch_tool

pytestmark = needs_patch_tool

# (test_kept_value_use's script head, with F: seven lines, so that the lines asserted below are the scripts')
HEAD = KEPT_HEAD.replace("from torch import nn\n", "from torch import nn\nimport torch.nn.functional as F\n")
SUMS = "print([round(p.sum().item(), 4) for p in model.parameters()])\n"


# ------------------------------------------------------------------ missing zero_grad
ACCUMULATING = HEAD + """\
for step in range(6):
    for micro_step in range(4):
        x, y = torch.randn(32, 8), torch.randn(32, 1)
        loss = F.mse_loss(model(x), y) / 4
        loss.backward()
    opt.step()
""" + SUMS


def test_gradients_accumulated_over_micro_batches_are_zeroed_after_the_step_not_before_each_backward(
    tmp_path: Path,
) -> None:
    finding = finding_of(diagnose(tmp_path, ACCUMULATING), "missing-zero-grad")
    assert finding.fix.startswith("call `opt.zero_grad()` right after the optimizer step at train.py:13, once per step")
    assert "+    opt.zero_grad()" in (finding.patch or "") and "+        opt.zero_grad()" not in (finding.patch or "")
    patched_runs_clean(tmp_path, finding.patch)
    trains_like(tmp_path, ACCUMULATING.replace("    opt.step()\n", "    opt.step()\n    opt.zero_grad()\n"))


def test_a_grad_scalers_step_names_the_optimizer_it_steps(tmp_path: Path) -> None:
    source = HEAD + """\
scaler = torch.amp.GradScaler("cpu", enabled=False)
for step in range(6):
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    scaler.scale(F.mse_loss(model(x), y)).backward()
    scaler.step(opt)
    scaler.update()
"""
    finding = finding_of(diagnose(tmp_path, source), "missing-zero-grad")
    assert finding.fix.startswith("call `opt.zero_grad()` before the backward at train.py:11")
    assert "scaler.zero_grad" not in finding.fix
    patched_runs_clean(tmp_path, finding.patch)


def test_gradients_clipped_in_place_are_still_found_stale(tmp_path: Path) -> None:
    source = HEAD + """\
for step in range(6):
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    F.mse_loss(model(x), y).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
"""
    finding = finding_of(diagnose(tmp_path, source), "missing-zero-grad")
    assert finding.evidence["parameters"] == 4 and finding.evidence["steps"][0] == 1


def test_of_two_optimizers_the_one_whose_gradients_went_stale_is_named(tmp_path: Path) -> None:
    source = """\
import torch
from torch import nn

torch.manual_seed(0)
actor, critic = nn.Linear(8, 2), nn.Linear(8, 1)
opt_actor = torch.optim.SGD(actor.parameters(), lr=0.1)
opt_critic = torch.optim.SGD(critic.parameters(), lr=0.1)
for step in range(6):
    x = torch.randn(16, 8)
    actor(x).pow(2).mean().backward()
    opt_actor.step()
    critic(x).pow(2).mean().backward()
    opt_critic.step()
    opt_critic.zero_grad()
"""
    finding = finding_of(diagnose(tmp_path, source), "missing-zero-grad")
    assert finding.evidence["optimizer"] == "opt_actor" and finding.evidence["sites"][0] == "train.py:11"
    patched_runs_clean(tmp_path, finding.patch)


GAN = """\
import torch
from torch import nn

torch.manual_seed(0)
G, D = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)), nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))
opt_G, opt_D = torch.optim.SGD(G.parameters(), lr=0.05), torch.optim.SGD(D.parameters(), lr=0.05)
for step in range(8):
    real, fake = torch.randn(16, 2) + 2, G(torch.randn(16, 4))
    G_loss = -D(fake).mean()
    opt_G.zero_grad()
    G_loss.backward()
    opt_G.step()
    D_loss = D(fake.detach()).mean() - D(real).mean()
    opt_D.zero_grad()
    D_loss.backward()
    opt_D.step()
print([round(p.sum().item(), 4) for p in [*G.parameters(), *D.parameters()]])
"""


def test_a_discriminators_zero_grad_goes_before_its_own_backward_not_the_generators(tmp_path: Path) -> None:
    """MorvanZhou's GAN with ``opt_D.zero_grad()`` removed: the step's first backward is G's, which reaches D's
    parameters too.  A zero before it (as graphwatch patched) adds G's gradients to D's update: training changed
    though the check passed.  The zero goes before D's own backward, after G's step."""
    source = GAN.replace("    opt_D.zero_grad()\n", "")
    finding = finding_of(diagnose(tmp_path, source), "missing-zero-grad")
    assert finding.fix.startswith("call `opt_D.zero_grad()` before the backward at train.py:14")
    patched_runs_clean(tmp_path, finding.patch)
    trains_like(tmp_path, GAN)


def test_micro_batches_zeroed_after_the_step_beside_another_optimizer_get_no_patch(tmp_path: Path) -> None:
    """Several critic backwards per step and a generator step in the same loop: a zero right after the critic's
    step would let the generator's backward, which reaches the critic's parameters, into its next update."""
    source = GAN.replace("    opt_D.zero_grad()\n    D_loss.backward()\n    opt_D.step()\n", """\
    for critic_step in range(2):
        D_loss = D(fake.detach()).mean() - D(real).mean()
        D_loss.backward()
    opt_D.step()
""").replace("    D_loss = D(fake.detach()).mean() - D(real).mean()\n    for", "    for")
    finding = finding_of(diagnose(tmp_path, source), "missing-zero-grad")
    assert finding.fix.startswith("call `opt_D.zero_grad()` right after the optimizer step at train.py:16")
    assert "another optimizer steps beside it (line 12)" in finding.fix and finding.patch is None


def test_gradients_reset_between_the_backward_and_the_step_are_named_as_reset_not_as_cut_off(tmp_path: Path) -> None:
    source = HEAD + """\
for step in range(30):
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    F.mse_loss(model(x), y).backward()
    opt.zero_grad(set_to_none=True)
    opt.step()
"""
    finding = finding_of(diagnose(tmp_path, source), "untrained-parameters")
    assert "although a backward reached them" in finding.message and "no backward reached them" not in finding.message
    assert "`opt.zero_grad()` (or the model's) called after the backward" in finding.fix


# ------------------------------------------------------------------ graphs carried across steps
def test_a_sum_that_starts_as_a_number_is_detached_only_once_it_is_a_tensor(tmp_path: Path) -> None:
    source = HEAD + """\
total = 0.0
for step in range(5):
    for micro_step in range(2):
        x, y = torch.randn(32, 8), torch.randn(32, 1)
        loss = F.mse_loss(model(x), y) / 2
        total = total + loss
    total.backward()
    opt.step()
    opt.zero_grad()
""" + SUMS
    finding = finding_of(diagnose(tmp_path, source), "graph-carried-across-steps")
    assert finding.fix.startswith("`if isinstance(total, torch.Tensor): total = total.detach()` at the start of each step")
    assert "used at" not in finding.message  # the add saved nothing: the line before it would be named
    patched_runs_clean(tmp_path, finding.patch)
    reset = source.replace("for step in range(5):\n", "for step in range(5):\n    total = 0.0\n")
    trains_like(tmp_path, reset)  # (the same gradients: the detached part of the sum has none)


def test_a_list_made_once_is_detached_item_by_item(tmp_path: Path) -> None:
    source = """\
import torch
from torch import nn

torch.manual_seed(0)
class Feats(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(4, 4), nn.Linear(4, 4)
    def forward(self, x):
        h = torch.tanh(self.l1(x))
        return [h, torch.tanh(self.l2(h))]
net = Feats()
target = torch.zeros(1, 4, requires_grad=True)
opt = torch.optim.Adam([target], lr=0.01)
style_features = net(torch.randn(1, 4))
for step in range(3):
    loss = sum(((f1 - f2) ** 2).mean() for f1, f2 in zip(net(target), style_features))
    opt.zero_grad()
    loss.backward()
    opt.step()
"""
    trace = diagnose(tmp_path, source)
    fixes = [f.fix for f in trace.findings]
    assert any("`[h.detach() for h in style_features]` where it is made" in fix for fix in fixes), fixes
    assert not any("style_features.detach()" in fix for fix in fixes), fixes


def test_a_retain_that_keeps_a_graph_made_before_the_loop_for_the_next_step_is_not_for_nothing(tmp_path: Path) -> None:
    source = """\
import torch
from torch import nn

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
target = torch.zeros(1, 4, requires_grad=True)
opt = torch.optim.Adam([target], lr=0.01)
fa = net(torch.randn(1, 4))
for step in range(20):
    loss = ((net(target) - fa) ** 2).mean()
    opt.zero_grad()
    loss.backward(retain_graph=True)
    opt.step()
"""
    trace = diagnose(tmp_path, source)
    assert [f.kind for f in trace.findings] == ["graph-carried-across-steps"], [str(f) for f in trace.findings]


# ------------------------------------------------------------------ graphs kept alive
def test_an_attribute_made_from_another_kept_one_defers_to_that_ones_fix(tmp_path: Path) -> None:
    source = HEAD + """\
class AverageMeter:
    def __init__(self):
        self.val = self.avg = self.sum = self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


meter = AverageMeter()
for step in range(12):
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    loss = F.mse_loss(model(x), y)
    meter.update(loss, 32)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""
    trace = diagnose(tmp_path, source)
    kept = {f.evidence["holder"]: f for f in trace.findings if f.kind == "graph-kept-alive"}
    assert kept["meter.avg"].patch is None and "is made from `meter.sum`" in kept["meter.avg"].fix
    patched_runs_clean(tmp_path, kept["meter.sum"].patch)


def test_two_evaluations_kept_by_two_names_each_get_their_own_lines_fix(tmp_path: Path) -> None:
    source = """\
import torch
from torch import nn

torch.manual_seed(0)
net_a, net_b = nn.Linear(4, 1), nn.Linear(4, 1)
opt = torch.optim.SGD([*net_a.parameters(), *net_b.parameters()], lr=0.1)
x, y, test_x = torch.randn(8, 4), torch.randn(8, 1), torch.randn(8, 4)
for t in range(30):
    loss = ((net_a(x) - y) ** 2).mean() + ((net_b(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if t % 5 == 0:
        test_a = net_a(test_x)
        test_b = net_b(test_x)
"""
    trace = diagnose(tmp_path, source)
    kept = {f.evidence["holder"]: f for f in trace.findings if f.kind == "graph-kept-alive"}
    assert kept["test_a"].fix.startswith("run the forward at train.py:14 under")
    assert kept["test_b"].fix.startswith("run the forward at train.py:15 under")


# ------------------------------------------------------------------ errors
def test_a_one_line_no_grad_block_is_named_as_the_cut(tmp_path: Path) -> None:
    source = HEAD + """\
for step in range(3):
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    with torch.no_grad(): loss = F.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""
    finding = finding_of(diagnose(tmp_path, source), "loss-without-graph")
    assert "run inside the `with torch.no_grad():` block at train.py:10" in finding.message
    assert "no `torch.no_grad()` block" not in finding.message


def test_a_scaled_loss_backwarded_twice_is_named_and_no_name_is_invented(tmp_path: Path) -> None:
    source = HEAD + """\
scaler = torch.amp.GradScaler("cpu", enabled=False)
x, y = torch.randn(32, 8), torch.randn(32, 1)
loss = F.mse_loss(model(x), y)
scaler.scale(loss).backward()
scaler.scale(loss).backward()
"""
    finding = finding_of(diagnose(tmp_path, source), "backward-through-freed-graph")
    assert "`loss` is backwarded twice" in finding.message and "loss_b" not in finding.message


def test_an_in_place_op_that_saved_nothing_is_found_in_the_source_not_in_a_module_built_inplace(
    tmp_path: Path,
) -> None:
    source = """\
import torch
from torch import nn
import torch.nn.functional as F

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2, inplace=True), nn.Linear(16, 4), nn.Tanh())
x, y = torch.randn(16, 8), torch.randn(16, 4)
out = model(x)
out.mul_(0.5)
F.mse_loss(out, y).backward()
"""
    finding = finding_of(diagnose(tmp_path, source), "modified-in-place")
    assert "then changed in place at train.py:9 (`out.mul_(0.5)`)" in finding.message
    assert "LeakyReLU" not in finding.message and finding.fix.startswith("`out = out.mul(0.5)` at train.py:9")


def test_a_backward_of_ones_own_beside_lightnings_automatic_one_is_the_one_dropped(tmp_path: Path) -> None:
    import pytest

    pytest.importorskip("lightning")
    source = """\
import torch
from torch import nn
import lightning.pytorch as pl


class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        loss.backward()
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=16)
trainer = pl.Trainer(max_steps=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Net(), data)
"""
    finding = finding_of(diagnose(tmp_path, source), "backward-through-freed-graph")
    assert finding.fix.startswith("drop the `loss.backward()` at train.py:14: the framework called at train.py:24")
    removed = [line for line in (finding.patch or "").splitlines() if line.startswith("-") and not line.startswith("---")]
    assert removed == ["-        loss.backward()"]
    patched_runs_clean(tmp_path, finding.patch)
