"""Holder and carrier shapes once answered wrongly or incompletely, each reduced to a few lines: an EMA buffer
updated in place in a Lightning hook (the module's own or a ``Callback``'s), a ``Callback``'s bound method
registered as a forward hook, a dict item holding two tensors with graphs, and two tensors kept from before
the loop that both carry a graph into every step.

Each program runs under ``graphwatch run`` in a scratch folder (:func:`test_leak_fixes.diagnose`); a patch is
applied with the real ``patch -p0``, the patched program runs again, clean, and trains as a fix written by hand.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_carried_state_places import CENTERING
from test_leak_fixes import diagnose, finding_of, patched_runs_clean, trains_like
from test_patches import needs_patch_tool

pytestmark = needs_patch_tool

# the end of each Lightning program: ten batches of a seeded fit (``{callbacks}``: the Trainer's callbacks, if any)
FIT = """\
torch.manual_seed(0)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(160, 8), torch.randn(160, 1)), batch_size=16)
model = Net()
trainer = pl.Trainer(max_steps=10, accelerator="cpu", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False{callbacks})
trainer.fit(model, data)
"""


# ------------------------------------------------------------------ an EMA buffer updated in a Lightning hook
LIGHTNING_EMA = """\
import torch
import torch.nn as nn
import lightning.pytorch as pl


class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(8, 1)
        self.register_buffer("ema_w", torch.zeros(1, 8))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.ema_w.mul_(0.99).add_(self.layer.weight, alpha=0.01)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


""" + FIT + """print([round(v, 5) for v in model.layer.weight.detach().flatten().tolist()], round(model.ema_w.sum().item(), 6))
"""
EMA_LINE = "        self.ema_w.mul_(0.99).add_(self.layer.weight, alpha=0.01)\n"


def test_an_ema_buffer_updated_in_a_lightning_modules_hook_is_one_finding_at_the_hooks_line_fixed_under_no_grad(
    tmp_path: Path,
) -> None:
    pytest.importorskip("lightning")
    source = LIGHTNING_EMA.replace("{callbacks}", "")
    finding = finding_of(diagnose(tmp_path, source), "graph-kept-alive")  # one: not again as "(its globals)"
    assert finding.evidence["holder"] == "model.ema_w" and finding.evidence["sites"][0] == "train.py:17"
    assert finding.fix.startswith("update `self.ema_w` under `with torch.no_grad():` at train.py:17")
    assert "+        with torch.no_grad():\n+            self.ema_w.mul_(0.99)" in (finding.patch or "")
    patched_runs_clean(tmp_path, finding.patch)
    trains_like(tmp_path, source.replace(EMA_LINE, "        with torch.no_grad():\n    " + EMA_LINE))


def test_an_ema_buffer_updated_by_a_callbacks_hook_is_fixed_at_the_callbacks_line(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    callback = """\
class EMA(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pl_module.ema_w.mul_(0.99).add_(pl_module.layer.weight, alpha=0.01)


"""
    source = LIGHTNING_EMA.replace("{callbacks}", ", callbacks=[EMA()]").replace(EMA_LINE, "        pass\n")
    source = source.replace("class Net(", callback + "class Net(")
    finding = finding_of(diagnose(tmp_path, source), "graph-kept-alive")
    assert finding.evidence["holder"] == "model.ema_w" and finding.evidence["sites"][0] == "train.py:8"
    assert finding.fix.startswith("update `pl_module.ema_w` under `with torch.no_grad():` at train.py:8")
    patched_runs_clean(tmp_path, finding.patch)
    update = "        pl_module.ema_w.mul_(0.99)"
    trains_like(tmp_path, source.replace(update, "        with torch.no_grad():\n    " + update))


def test_a_list_kept_by_a_callbacks_bound_method_registered_as_a_forward_hook_is_named_and_fixed(
    tmp_path: Path,
) -> None:
    pytest.importorskip("lightning")
    source = """\
import torch
import torch.nn as nn
import lightning.pytorch as pl


class ActivationLogger(pl.Callback):
    def __init__(self):
        self.activations = []

    def on_train_start(self, trainer, pl_module):
        pl_module.encoder.register_forward_hook(self._keep)

    def _keep(self, module, inputs, output):
        self.activations.append(output)


class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 16), nn.Tanh())
        self.head = nn.Linear(16, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.head(self.encoder(x)), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


""" + FIT.replace("{callbacks}", ", callbacks=[ActivationLogger()]") + """\
print([round(v, 5) for v in model.head.weight.detach().flatten().tolist()])
"""
    finding = finding_of(diagnose(tmp_path, source), "graph-kept-alive")
    assert finding.evidence["holder"] == "self.activations" and finding.evidence["sites"][0] == "train.py:14"
    assert finding.fix.startswith("keep a detached tensor, not the graph: `self.activations.append(output.detach())`")
    patched_runs_clean(tmp_path, finding.patch)
    trains_like(tmp_path, source.replace("append(output)", "append(output.detach())"))


# ------------------------------------------------------------------ a dict item holding two graphs
def test_every_part_of_a_kept_dict_item_that_carries_a_graph_is_named_in_the_fix(tmp_path: Path) -> None:
    source = """\
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
history = []
for step in range(8):
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    loss = nn.functional.mse_loss(model(x), y)
    history.append({"step": step, "loss": loss, "pred": model(x)})
    opt.zero_grad()
    loss.backward()
    opt.step()
"""
    finding = finding_of(diagnose(tmp_path, source), "graph-kept-alive")
    assert finding.evidence["holder"] == "history" and finding.evidence["kept"]["items"] < 8  # items, not tensors
    assert finding.fix.startswith("store each of `loss` and `model(x)` (the 2 parts of each item that carry a graph)")
    assert "['loss']` and `history[" in finding.fix and finding.fix.count("['pred']") == 1
    assert finding.patch is None  # (advice only, as for a single part: no patch that leaves a part carrying it)


# ------------------------------------------------------------------ two tensors carry a graph into each step
TWO_KEPT = """\
import torch
import torch.nn as nn

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
target = torch.zeros(1, 4, requires_grad=True)
opt = torch.optim.Adam([target], lr=0.01)
a, b = torch.randn(1, 4), torch.randn(1, 4)
fa = net(a)
fb = net(b)
for step in range(6):
    ft = net(target)
    loss_a = ((ft - fa) ** 2).mean()
    loss_b = ((2 * ft - fb) ** 2).mean()
    loss = loss_a + loss_b
    opt.zero_grad()
    loss.backward()
    opt.step()
print([round(v, 6) for v in target.detach().flatten().tolist()])
"""
BOTH_DETACHED = TWO_KEPT.replace("fa = net(a)\n", "fa = net(a).detach()\n").replace("fb = net(b)\n", "fb = net(b).detach()\n")


def test_two_kept_tensors_that_each_carry_a_freed_graph_into_the_next_step_are_both_detached(tmp_path: Path) -> None:
    trace = diagnose(tmp_path, TWO_KEPT)
    error = finding_of(trace, "backward-through-freed-graph")
    carried = finding_of(trace, "graph-carried-across-steps")
    for finding in (error, carried):
        assert "`fa.detach()`" in finding.fix and "`fb.detach()`" in finding.fix, finding.fix
    assert "`fa` made at train.py:9" in error.message and "`fb` made at train.py:10" in error.message
    assert "used at train.py:13" not in error.message  # (`fa`'s line, read off the op before `fb`'s use at 14)
    assert "+fa = net(a).detach()" in (error.patch or "") and "+fb = net(b).detach()" in (error.patch or "")
    assert carried.patch == error.patch
    patched_runs_clean(tmp_path, error.patch)
    trains_like(tmp_path, BOTH_DETACHED)


def test_two_kept_tensors_carried_under_retain_graph_are_both_detached_and_the_retain_dropped(tmp_path: Path) -> None:
    source = TWO_KEPT.replace("loss.backward()", "loss.backward(retain_graph=True)")
    carried = finding_of(diagnose(tmp_path, source), "graph-carried-across-steps")
    assert "`fb`" in carried.message and "`fa` produced at train.py:9" in carried.message
    assert "+fa = net(a).detach()" in (carried.patch or "") and "+fb = net(b).detach()" in (carried.patch or "")
    assert "+    loss.backward()" in (carried.patch or "")  # else the patched run keeps a graph for nothing
    patched_runs_clean(tmp_path, carried.patch)
    trains_like(tmp_path, BOTH_DETACHED)


def test_of_two_carriers_one_made_by_a_trained_module_withholds_the_patch_and_says_why(tmp_path: Path) -> None:
    source = TWO_KEPT.replace(
        "opt = torch.optim.Adam([target], lr=0.01)", "opt = torch.optim.Adam([target, *net[0].parameters()], lr=0.01)"
    ).replace("fb = net(b)", "frozen = nn.Linear(4, 4)\nfb = frozen(b)")  # fa: made by `net`, which trains; fb: not
    carried = finding_of(diagnose(tmp_path, source.replace("loss.backward()", "loss.backward(retain_graph=True)")),
                         "graph-carried-across-steps")  # fmt: skip
    assert "`fa`" in carried.fix and "`fb`" in carried.fix, carried.fix
    assert "no patch: the fix of `fa` needs your judgement" in carried.fix
    assert carried.patch is None


# ------------------------------------------------------------------ a running buffer of a submodule, under Lightning
LIGHTNING_RUNNING_BUFFER = "import torch\nimport torch.nn as nn\nimport lightning.pytorch as pl\n\n\n" + CENTERING + """

class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), Centering(16), nn.ReLU(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.body(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


""" + FIT.format(callbacks="")


def test_a_submodules_running_buffer_under_lightning_is_named_by_its_store_seen_from_lightnings_backward(
    tmp_path: Path,
) -> None:
    """Step 1's backward runs into step 0's freed graph through ``self.running_mean``, a buffer of a submodule
    that its ``forward`` renews outside ``no_grad``. The only frame that names the model is Lightning's
    ``backward`` (its ``self``): the buffer is found below it and named by its store, with the fix there (it was
    "the tensor", and a fix at ``trainer.fit(...)``)."""
    pytest.importorskip("lightning")
    carried = finding_of(diagnose(tmp_path, LIGHTNING_RUNNING_BUFFER), "graph-carried-across-steps")
    assert carried.evidence["carrier"] == "self.running_mean"
    assert carried.evidence["sites"][0] == "train.py:13"
    assert carried.fix.startswith(
        "store `self.running_mean` without its graph where the module renews it, at train.py:13: "
        "`self.running_mean = (0.9 * self.running_mean + 0.1 * x.mean(0)).detach()`"
    )
    assert carried.patch is None
