"""Where the detach of a state the loop means to carry goes, and which lines its finding cites (issue 39), when
the backward is in no loop of its function: a ``train_step()`` helper the loop calls, a spiking neuron that
stores its membrane on itself at every time step.

Each program runs under ``graphwatch run`` in a scratch folder; a patch is applied with the real ``patch -p0``
and the patched program must run clean and print what a fix written by hand prints.
"""

from __future__ import annotations

from pathlib import Path

from test_carried_state_fixes import run_with
from test_leak_fixes import finding_of, patched_runs_clean, trains_like
from test_patches import needs_patch_tool

pytestmark = needs_patch_tool

# the state is kept on the model by a helper that also runs the backward: no loop holds both lines
STATE_ON_MODEL_IN_HELPER = """\
import torch
from torch import nn


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell, self.head = nn.RNNCell(4, 8), nn.Linear(8, 1)
        self.hidden = torch.zeros(2, 8)


def train_step(model, opt, x):
    opt.zero_grad()
    model.hidden = model.cell(x, model.hidden)
    loss = model.head(model.hidden).pow(2).mean()
    loss.backward()
    opt.step()
    return loss.item()


torch.manual_seed(0)
model = Recurrent()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    print(f"{train_step(model, opt, torch.randn(2, 4)):.6f}")
"""


def test_a_state_a_train_step_helper_keeps_on_the_model_is_detached_first_in_the_helper(tmp_path: Path) -> None:
    """The backward's function, ``train_step()``, holds the store and the backward in no loop: it runs once per
    step, so the detach goes first in it (before, no loop was found and the patch was lost)."""
    (tmp_path / "train.py").write_text(STATE_ON_MODEL_IN_HELPER)
    carried = finding_of(run_with(tmp_path, "train.py"), "graph-carried-across-steps")
    assert carried.fix.startswith("`model.hidden = model.hidden.detach()` at the start of each step, before train.py:14")
    assert "+    model.hidden = model.hidden.detach()\n     model.hidden = model.cell(" in (carried.patch or "")
    patched_runs_clean(tmp_path, carried.patch)
    detached = "model.cell(x, model.hidden.detach())"
    trains_like(tmp_path, STATE_ON_MODEL_IN_HELPER.replace("model.cell(x, model.hidden)", detached))


# a train_step() helper returns the state; the loop feeds it back in; the model is the user's own module
HIDDEN_THROUGH_HELPER = """\
import torch
from torch import nn


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.rnn, self.head = nn.Embedding(10, 4), nn.GRU(4, 8), nn.Linear(8, 1)

    def forward(self, x, hidden):
        out, hidden = self.rnn(self.embed(x), hidden)
        return self.head(out), hidden


def train_step(model, opt, x, hidden):
    opt.zero_grad()
    out, hidden = model(x, hidden)
    loss = out.pow(2).mean()
    loss.backward()
    opt.step()
    return loss.item(), hidden


torch.manual_seed(0)
model = LM()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
hidden = torch.zeros(1, 2, 8)
for step in range(3):
    loss, hidden = train_step(model, opt, torch.randint(0, 10, (5, 2)), hidden)
"""


def test_the_helpers_call_that_feeds_the_state_into_the_model_is_cited(tmp_path: Path) -> None:
    """The state is used inside ``forward``; the user's line that hands it over, in the function that runs the
    backward, is among the finding's lines (it was not: only ``forward``'s line and the loop's were)."""
    (tmp_path / "train.py").write_text(HIDDEN_THROUGH_HELPER)
    carried = finding_of(run_with(tmp_path, "train.py"), "graph-carried-across-steps")
    assert "train.py:17" in carried.evidence["sites"]  # out, hidden = model(x, hidden)
    assert "train.py:11" in carried.evidence["sites"]  # out, hidden = self.rnn(self.embed(x), hidden), where it is used


# an snntorch-style leaky neuron: the membrane is stored on the neuron at every time step, never reset
SPIKING = """\
import torch
from torch import nn


class Leaky(nn.Module):
    def __init__(self, size, beta=0.9):
        super().__init__()
        self.beta = beta
        self.mem = torch.zeros(size)

    def forward(self, x):
        self.mem = self.beta * self.mem + x
        return torch.sigmoid(4.0 * (self.mem - 1.0))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.lif, self.fc2 = nn.Linear(6, 10), Leaky(10), nn.Linear(10, 2)

    def forward(self, x):
        return self.fc2(self.lif(self.fc1(x)))


torch.manual_seed(0)
net = Net()
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for batch in range(3):
    opt.zero_grad()
    out = torch.stack([net(torch.randn(6)) for t in range(4)]).mean(0)
    out.pow(2).mean().backward()
    opt.step()
"""


def test_a_spiking_membrane_is_named_by_its_store_on_the_neuron_and_never_recomputed(tmp_path: Path) -> None:
    """The membrane ``self.mem`` of a submodule: the finding names its store ``self.mem = ...`` (it named the
    outer ``forward``'s line), and the fix detaches it once a step, keeping it; no patch detaches it inside
    ``forward``, which runs at every time step (that would cut the backpropagation through time)."""
    (tmp_path / "train.py").write_text(SPIKING)
    carried = finding_of(run_with(tmp_path, "train.py"), "graph-carried-across-steps")
    assert carried.evidence["carrier"] == "self.mem"
    assert carried.evidence["sites"][0] == "train.py:12"  # self.mem = self.beta * self.mem + x
    assert carried.evidence["pattern"] == "recurrent"
    assert carried.fix.startswith("`self.mem = self.mem.detach()` once at the start of each step, on the object")
    assert "not inside it: it stores the state at train.py:12 more than once a step" in carried.fix
    assert not any("inside the step that uses it" in r.text for r in carried.remedies)
    assert carried.patch is None


# a running statistic kept in a registered buffer of a submodule, renewed in its forward outside no_grad: each
# step's new mean is made from the last one, so step 1's backward runs into step 0's freed graph
CENTERING = """\
class Centering(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.register_buffer("running_mean", torch.zeros(dim))

    def forward(self, x):
        if self.training:
            self.running_mean = 0.9 * self.running_mean + 0.1 * x.mean(0)
        return x - self.running_mean
"""
RUNNING_BUFFER = "import torch\nfrom torch import nn\n\n\n" + CENTERING + """

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), Centering(16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(4):
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"{loss.item():.6f}")
"""


def test_a_submodules_buffer_renewed_outside_no_grad_is_named_by_its_store_and_stored_detached(tmp_path: Path) -> None:
    """The graph crosses steps through ``self.running_mean``, a buffer of the ``Centering`` submodule: the error
    names it and its store (before: "the tensor", and a fix at the loop's line), and the fix stores it detached
    there, as the line would read; no patch (whether this step's gradient should flow through the new mean is
    the user's call).  Stored detached by hand, the program trains as the known fix (the batch mean detached)."""
    (tmp_path / "train.py").write_text(RUNNING_BUFFER)
    trace = run_with(tmp_path, "train.py")
    carried = finding_of(trace, "graph-carried-across-steps")
    assert carried.evidence["carrier"] == "self.running_mean"
    assert carried.evidence["sites"][0] == "train.py:12"  # self.running_mean = 0.9 * ... + 0.1 * x.mean(0)
    stored = "self.running_mean = (0.9 * self.running_mean + 0.1 * x.mean(0)).detach()"
    renews = "store `self.running_mean` without its graph where the module renews it, at train.py:12"
    assert carried.fix.startswith(f"{renews}: `{stored}`")
    assert carried.patch is None
    freed = finding_of(trace, "backward-through-freed-graph")
    assert "carried into step 1 by `self.running_mean` produced at train.py:12" in freed.message
    (tmp_path / "train.py").write_text(RUNNING_BUFFER.replace("self.running_mean = 0.9 * self.running_mean + 0.1 * x.mean(0)", stored))
    trains_like(tmp_path, RUNNING_BUFFER.replace("x.mean(0)", "x.mean(0).detach()"))


def test_the_loops_own_modules_buffer_renewed_outside_no_grad_is_named_by_its_store(tmp_path: Path) -> None:
    """The buffer of the very module the loop names (``model.running_mean``): named as its store in the module's
    ``forward`` spells it, with that line (a module's other attributes are named by the line that made their
    graph)."""
    source = RUNNING_BUFFER.replace(
        "class Centering(nn.Module):\n    def __init__(self, dim):\n        super().__init__()\n",
        "class Centering(nn.Module):\n    def __init__(self, dim):\n        super().__init__()\n"
        "        self.lin = nn.Linear(8, dim)\n",
    ).replace("    def forward(self, x):\n", "    def forward(self, x):\n        x = self.lin(x)\n").replace(
        "nn.Sequential(nn.Linear(8, 16), Centering(16), nn.ReLU(), nn.Linear(16, 1))", "Centering(16)"
    ).replace("nn.functional.mse_loss(model(x), y)", "model(x).pow(2).mean()")
    (tmp_path / "train.py").write_text(source)
    carried = finding_of(run_with(tmp_path, "train.py"), "graph-carried-across-steps")
    assert carried.evidence["carrier"] == "self.running_mean"
    assert carried.evidence["sites"][0] == "train.py:14"  # self.running_mean = 0.9 * ... (the Linear's line before it)
    assert carried.fix.startswith("store `self.running_mean` without its graph where the module renews it, at train.py:14")
    assert carried.patch is None
