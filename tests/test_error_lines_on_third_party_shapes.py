"""Lines graphwatch named wrongly, or not at all, on shapes of third-party training code (nanoGPT's residual
block, a yunjey GAN and style transfer): each program runs under ``graphwatch run`` in a scratch folder
(:func:`test_leak_fixes.diagnose`), and a patch, where one is offered, is applied with the real ``patch -p0`` and
the patched program runs again, clean, and trains as a known-good fix.
"""

from __future__ import annotations

from pathlib import Path

from test_leak_fixes import diagnose, finding_of, patched_runs_clean, trains_like
from test_patches import needs_patch_tool

pytestmark = needs_patch_tool

SUMS = 'print([round(p.sum().item(), 4) for p in model.parameters()])\n'

# ------------------------------------------------------------------ a residual added in place
# (LayerNorm saves its input; the in-place add changes it before the backward)
RESIDUAL = """\
import torch
from torch import nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        x = x + 0
        x += self.fc(self.ln(x))
        return x


torch.manual_seed(0)
model = nn.Sequential(Block(), nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x, y = torch.randn(32, 16), torch.randn(32, 4)
    loss = F.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
""" + SUMS


def test_an_inplace_residual_on_a_tensor_its_function_made_is_patched_and_called_no_view(tmp_path: Path) -> None:
    """The input is data (it requires no grad), so the tensor ``x + 0`` required none when LayerNorm saved it:
    graphwatch called it a view and withheld the patch, though the function made it on the line before."""
    finding = finding_of(diagnose(tmp_path, RESIDUAL), "modified-in-place")
    assert "then changed in place at train.py:14 (`x += self.fc(self.ln(x))`)" in finding.message
    assert "view" not in finding.message
    assert finding.fix == "`x = x + self.fc(self.ln(x))` at train.py:14"
    patched_runs_clean(tmp_path, finding.patch)
    trains_like(tmp_path, RESIDUAL.replace("x += self.fc", "x = x + self.fc"))


def test_an_inplace_residual_on_the_callers_data_tensor_gets_no_patch_and_no_view_said(tmp_path: Path) -> None:
    """``x`` is the caller's batch: out of place, the caller's tensor would no longer change; graphwatch cannot
    tell that nothing reads it, so it says why it withholds the patch, truly (no view is involved)."""
    source = RESIDUAL.replace("        x = x + 0\n", "")
    finding = finding_of(diagnose(tmp_path, source), "modified-in-place")
    assert "then changed in place at train.py:13 (`x += self.fc(self.ln(x))`)" in finding.message
    assert "view" not in finding.message and finding.patch is None
    assert finding.fix == (
        "the in-place operation at train.py:13 changed `x`, a tensor its function was given (the caller's tensor "
        "changes too): make it out of place only if the caller need not see the change (e.g. "
        "`x = x + self.fc(self.ln(x))`)"
    )


def test_an_inplace_residual_on_an_activation_the_function_was_given_gets_no_patch(tmp_path: Path) -> None:
    """The block's input is the previous layer's output (it requires grad): out of place, the caller's tensor,
    which the caller reads again here, would no longer change, and the model would compute something else."""
    source = RESIDUAL.replace("        x = x + 0\n", "").replace(
        "model = nn.Sequential(Block(), nn.Linear(16, 4))",
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.inp, self.block, self.out = nn.Linear(16, 16), Block(), nn.Linear(16, 4)\n\n"
        "    def forward(self, x):\n"
        "        h = self.inp(x)\n"
        "        self.block(h)\n"
        "        return self.out(h)\n\n\n"
        "model = Net()",
    )
    finding = finding_of(diagnose(tmp_path, source), "modified-in-place")
    assert "then changed in place at train.py:13 (`x += self.fc(self.ln(x))`)" in finding.message
    assert finding.patch is None and "a tensor its function was given (the caller's tensor changes too)" in finding.fix


NANOGPT_BLOCK = """\
import torch
from torch import nn
import torch.nn.functional as F


class LayerNorm(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, None, 1e-5)


class MLP(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.c_fc, self.c_proj = nn.Linear(n, 4 * n), nn.Linear(4 * n, n)

    def forward(self, x):
        x = self.c_fc(x)
        x = F.gelu(x)
        x = self.c_proj(x)
        return x


class Block(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.ln_1, self.attn = LayerNorm(n), nn.Linear(n, n)
        self.ln_2, self.mlp = LayerNorm(n), MLP(n)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x += self.mlp(self.ln_2(x))
        return x


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), Block(16), Block(16), nn.Linear(16, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(3):
    x, y = torch.randn(4, 6, 8), torch.randn(4, 6, 1)
    loss = F.mse_loss(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
""" + SUMS


def test_a_residual_added_in_place_after_a_call_into_the_users_module_names_its_line(tmp_path: Path) -> None:
    """The in-place add saves nothing: the last line that saved ran inside ``MLP.forward``, whose caller's line
    is the in-place statement itself (it goes on once the call returns); graphwatch said it could not tell."""
    finding = finding_of(diagnose(tmp_path, NANOGPT_BLOCK), "modified-in-place")
    assert "could not tell" not in finding.message
    assert "then changed in place at train.py:35 (`x += self.mlp(self.ln_2(x))`)" in finding.message
    assert finding.fix == "`x = x + self.mlp(self.ln_2(x))` at train.py:35"
    patched_runs_clean(tmp_path, finding.patch)
    trains_like(tmp_path, NANOGPT_BLOCK.replace("x += self.mlp", "x = x + self.mlp"))


# ------------------------------------------------------------------ parameters cut off from the loss
GAN = """\
import torch
from torch import nn

torch.manual_seed(0)
G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
D = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1), nn.Sigmoid())
criterion = nn.BCELoss()
d_optimizer = torch.optim.Adam(D.parameters(), lr=2e-4)
g_optimizer = torch.optim.Adam(G.parameters(), lr=2e-4)
for step in range(12):
    images = torch.randn(16, 8)
    real_labels, fake_labels = torch.ones(16, 1), torch.zeros(16, 1)
    d_loss = criterion(D(images), real_labels) + criterion(D(G(torch.randn(16, 4))), fake_labels)
    d_optimizer.zero_grad()
    g_optimizer.zero_grad()
    d_loss.backward()
    d_optimizer.step()

    fake_images = G(torch.randn(16, 4)).detach()
    outputs = D(fake_images)
    g_loss = criterion(outputs, real_labels)
    d_optimizer.zero_grad()
    g_optimizer.zero_grad()
    g_loss.backward()
    g_optimizer.step()
"""


def test_a_generator_detached_at_its_own_step_is_named_at_the_detach_not_as_reset_gradients(tmp_path: Path) -> None:
    """D's backward reaches G (its fake is not detached) and the zero_grad() before G's backward clears that
    gradient: graphwatch blamed a zero_grad() after the backward, and cited only the step's line."""
    finding = finding_of(diagnose(tmp_path, GAN), "untrained-parameters")
    assert ("the statement at train.py:19 (`fake_images = G(torch.randn(16, 4)).detach()`) cuts them off from the "
            "loss whose backward runs before `g_optimizer.step()`") in finding.message
    assert "reset" not in finding.message and "zero_grad" not in finding.fix
    assert finding.evidence["sites"] == ["train.py:19", "train.py:25"]
    assert finding.fix.startswith("if `g_optimizer` is meant to train all 4 parameters of G with the loss whose "
                                  "backward runs before `g_optimizer.step()`, drop the `.detach()` at train.py:19")


STYLE = """\
import torch
from torch import nn


class Features(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])

    def forward(self, x):
        features = []
        for layer in self.layers:
            x = torch.tanh(layer(x))
            features.append(x)
        return features


torch.manual_seed(0)
net = Features().eval()
content, style = torch.randn(1, 8), torch.randn(1, 8)
target = content.clone().requires_grad_(True)
optimizer = torch.optim.Adam([target], lr=0.01)
for step in range(12):
    target_features = net(target.detach())
    content_features, style_features = net(content), net(style)
    loss = 0
    for f1, f2, f3 in zip(target_features, content_features, style_features):
        g1, g3 = f1.t() @ f1, f3.t() @ f3
        loss += torch.mean((f1 - f2) ** 2) + torch.mean((g1 - g3) ** 2)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_an_image_optimized_through_a_detached_copy_names_the_detach(tmp_path: Path) -> None:
    """The parameter is the image itself, detached where the features are computed; the walk back from the
    loss goes through the loop over the features' layers."""
    finding = finding_of(diagnose(tmp_path, STYLE), "untrained-parameters")
    assert "the statement at train.py:24 (`target_features = net(target.detach())`) cuts them off" in finding.message
    assert "(the `.detach()` of `target` on their way to that loss, whose graph reaches none of them)" in finding.message
    assert finding.evidence["sites"][0] == "train.py:24"


def test_an_encoder_run_under_no_grad_names_the_block_and_the_statement(tmp_path: Path) -> None:
    source = """\
import torch
from torch import nn

torch.manual_seed(0)
encoder, head = nn.Linear(8, 16), nn.Linear(16, 1)
opt = torch.optim.SGD([*encoder.parameters(), *head.parameters()], lr=0.1)
for step in range(12):
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    with torch.no_grad():
        features = torch.relu(encoder(x))
    loss = (head(features) - y).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""
    finding = finding_of(diagnose(tmp_path, source), "untrained-parameters")
    assert ("the statement at train.py:10 (`features = torch.relu(encoder(x))`), run under the `with "
            "torch.no_grad():` at train.py:9 (`with torch.no_grad():`), cuts them off") in finding.message
    assert "compute `torch.relu(encoder(x))` at train.py:10 outside the `with torch.no_grad():` block" in finding.fix


def test_parameters_of_a_module_never_called_keep_the_general_words(tmp_path: Path) -> None:
    """No cut on the loss's way (the module is never called): nothing is named that the program does not do."""
    source = """\
import torch
from torch import nn

torch.manual_seed(0)
used, unused = nn.Linear(8, 1), nn.Linear(8, 1)
opt = torch.optim.SGD([*used.parameters(), *unused.parameters()], lr=0.1)
for step in range(12):
    x = torch.randn(32, 8)
    loss = used(x.detach()).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""
    finding = finding_of(diagnose(tmp_path, source), "untrained-parameters")
    assert "the statement at" not in finding.message and "cuts them off" not in finding.message
    assert "most likely in a module the forward never calls" in finding.message
    assert finding.evidence["sites"] == ["train.py:12"]


# ------------------------------------------------------------------ tensors made before the loop
PRECOMPUTED = """\
import torch
from torch import nn

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8)).eval()
for p in net.parameters():
    p.requires_grad_(False)
style = torch.randn(1, 8)
target = torch.randn(1, 8, requires_grad=True)
optimizer = torch.optim.Adam([target], lr=0.01)
style_features = net(style) * target.sum()
for step in range(4):
    loss = (net(target) - style_features).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def test_a_tensor_made_by_a_set_up_line_before_the_loop_is_said_made_before_the_loop(tmp_path: Path) -> None:
    """The session counts step 0 from its start: a tensor the set-up made was said "made in step 0"."""
    trace = diagnose(tmp_path, PRECOMPUTED)
    error = finding_of(trace, "backward-through-freed-graph")
    assert ("`style_features` made at train.py:11 (`style_features = net(style) * target.sum()`) before the loop "
            "at train.py:12 is kept and used again in step 1") in error.message
    assert "created at train.py:11 (`style_features = net(style) * target.sum()`) before the loop at train.py:12" \
        in error.message
    assert "in step 0" not in error.message and "freed by step 0's backward" in error.message
    assert "instead of keeping it from before the loop at train.py:12" in error.fix
    carried = finding_of(trace, "graph-carried-across-steps")
    assert "before the loop at train.py:12 is kept and used again in later steps" in carried.message


def test_a_tensor_kept_from_the_first_pass_of_the_loop_is_still_said_made_in_step_0(tmp_path: Path) -> None:
    source = PRECOMPUTED.replace("style_features = net(style) * target.sum()\nfor step in range(4):\n",
                                 "style_features = None\nfor step in range(4):\n"
                                 "    if style_features is None:\n"
                                 "        style_features = net(style) * target.sum()\n")
    error = finding_of(diagnose(tmp_path, source), "backward-through-freed-graph")
    assert "made at train.py:14 (`style_features = net(style) * target.sum()`) in step 0" in error.message
    assert "before the loop" not in error.message


def test_a_tensor_made_at_the_top_of_a_step_function_is_not_said_made_before_the_loop(tmp_path: Path) -> None:
    """The function that makes it and backwards runs once per step, and holds no loop: the line is step 0's."""
    source = PRECOMPUTED.replace(
        "style_features = net(style) * target.sum()\nfor step in range(4):\n"
        "    loss = (net(target) - style_features).pow(2).mean()\n",
        "cache = {}\n\n\ndef train_step():\n"
        "    features = cache.setdefault('style', net(style) * target.sum())\n"
        "    loss = (net(target) - features).pow(2).mean()\n",
    ).replace("    optimizer.step()\n", "    optimizer.step()\n\n\nfor step in range(4):\n    train_step()\n")
    error = finding_of(diagnose(tmp_path, source), "backward-through-freed-graph")
    assert "in step 0" in error.message and "before the loop" not in error.message


# ------------------------------------------------------------------ an in-place call inside another call
# (yunjey's VAE with its reconstruction clamped in place inside the loss: sigmoid saved its output)
CLAMPED = """\
import torch
from torch import nn
import torch.nn.functional as F

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 16), nn.Sigmoid())
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(3):
    x = torch.rand(32, 16)
    x_reconst = model(x)
    loss = F.binary_cross_entropy(x_reconst.clamp_(1e-6, 1 - 1e-6), x, reduction="sum")
    opt.zero_grad()
    loss.backward()
    opt.step()
""" + SUMS


def test_an_inplace_call_inside_the_loss_call_is_named_and_made_out_of_place_on_a_line_before(tmp_path: Path) -> None:
    """``x_reconst.clamp_(...)`` as the loss's argument changes sigmoid's saved output: graphwatch said it could not
    tell which line.  The line is named, and the patch clamps out of place on a line of its own, so that the name
    still sees the clamped values."""
    finding = finding_of(diagnose(tmp_path, CLAMPED), "modified-in-place")
    assert "then changed in place at train.py:11 (`loss = F.binary_cross_entropy(x_reconst.clamp_(" in finding.message
    assert "could not tell" not in finding.message
    assert "+    x_reconst = x_reconst.clamp(1e-6, 1 - 1e-6)" in (finding.patch or "")
    patched_runs_clean(tmp_path, finding.patch)
    trains_like(tmp_path, CLAMPED.replace("(x_reconst.clamp_(", "(x_reconst.clamp("))
