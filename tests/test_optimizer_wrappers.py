"""An optimizer is the same optimizer through its wrappers (issue 39): accelerate's ``AcceleratedOptimizer``
and Lightning's ``LightningOptimizer`` are the optimizer they wrap, named as the script names the wrapper, in
what trained, in the optimizers a finding names and in ``--check-fixes``.

Real accelerate and Lightning objects and runs, on CPU; ``--check-fixes`` runs as a real process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

pytest.importorskip("accelerate")
pytest.importorskip("lightning")
import accelerate
import lightning.pytorch as pl
from lightning.pytorch.core.optimizer import LightningOptimizer

import graphwatch
from graphwatch.capture.causes.ownership import optimizers_in_frames
from graphwatch.capture.causes.parameters import ParameterLedger
from graphwatch.capture.hooks.optimizer import unwrapped

# The hidden state carried without a detach, through accelerate: the second backward fails; the fix detaches
# it, and the patched run stops after a few of its twelve steps (the optimizers that never stepped are counted
# then: a wrapper among them was one more optimizer, and the check failed).
CARRIED_THROUGH_ACCELERATE = """\
    import torch
    from accelerate import Accelerator
    from torch import nn

    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    cell, head = nn.RNNCell(4, 8), nn.Linear(8, 1)
    model, opt = accelerator.prepare(nn.ModuleList([cell, head]), torch.optim.AdamW([*cell.parameters(), *head.parameters()]))
    h = torch.zeros(2, 8)
    for _ in range(12):
        h = cell(torch.randn(2, 4), h)
        loss = head(h).pow(2).mean()
        opt.zero_grad()
        accelerator.backward(loss)
        opt.step()
    print(sum(p.sum().item() for p in model.parameters()))
"""


class ManualGAN(pl.LightningModule):
    """Manual optimization: ``self.optimizers()`` gives LightningOptimizers; D steps, then G on a fresh D(fake)."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.G = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 2))
        self.D = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        opt_g, opt_d = self.optimizers()
        (real,) = batch
        fake = self.G(torch.randn(4, 2))
        loss_d = (self.D(real) - 1).pow(2).mean() + self.D(fake.detach()).pow(2).mean()
        opt_d.zero_grad()
        self.manual_backward(loss_d)
        opt_d.step()
        loss_g = (self.D(fake) - 1).pow(2).mean()
        opt_g.zero_grad()
        self.manual_backward(loss_g)
        opt_g.step()

    def configure_optimizers(self) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
        return torch.optim.Adam(self.G.parameters(), lr=1e-3), torch.optim.SGD(self.D.parameters(), lr=1e-3)


def test_a_wrapper_unwraps_to_the_optimizer_it_steps_and_frames_name_that_one() -> None:
    adam = torch.optim.Adam(nn.Linear(2, 1).parameters())
    opt = LightningOptimizer(adam)
    assert isinstance(opt, torch.optim.Optimizer) and unwrapped(opt) is adam and unwrapped(adam) is adam
    held = [optimizer for name, optimizer in optimizers_in_frames(sys._getframe()) if name in ("adam", "opt")]
    assert held == [adam]  # one optimizer, whichever name the frames give it: the wrapper is no other one


def test_the_ledger_counts_an_accelerated_optimizer_once_under_the_scripts_name(no_session_left: None) -> None:
    torch.manual_seed(0)
    accelerator = accelerate.Accelerator(cpu=True)
    layer = nn.Linear(3, 1)
    model, opt = accelerator.prepare(layer, torch.optim.AdamW(layer.parameters()))
    assert type(opt).__name__ == "AcceleratedOptimizer"
    with ParameterLedger(step=lambda: 0) as ledger:
        for _ in range(2):
            opt.zero_grad()
            accelerator.backward(model(torch.ones(2, 3)).sum())
            opt.step()
        ledger.find_unstepped()  # (the wrapper is alive, and its own step() never ran Optimizer's)
    optimizers, parameters = ledger.records()
    assert [o.label for o in optimizers if o.steps] == ["opt (AdamW)"]
    assert not any(o.kind == "AcceleratedOptimizer" for o in optimizers)
    mine = [p for p in parameters if p.optimizer == optimizers[0].index]  # (others: garbage of other tests)
    assert [p.shape for p in mine] == [(1, 3), (1,)] and all(p.trained for p in mine)


def test_lightning_manual_optimization_names_each_optimizer_as_the_training_step_does(
    tmp_path: Path, no_session_left: None
) -> None:  # fmt: skip
    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(12, 2)), batch_size=4)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path))  # fmt: skip
    with warnings.catch_warnings(), ParameterLedger(step=lambda: 0) as ledger:
        warnings.simplefilter("ignore")  # (Lightning's advice on data loader workers)
        trainer.fit(ManualGAN(), data)
    optimizers, parameters = ledger.records()
    assert sorted(o.label for o in optimizers) == ["opt_d (SGD)", "opt_g (Adam)"]
    assert all(o.steps == 3 for o in optimizers) and all(p.trained for p in parameters)


def test_check_fixes_holds_a_detach_under_accelerate_stepped_by_the_same_optimizer(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(textwrap.dedent(CARRIED_THROUGH_ACCELERATE))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NO_COLOR": "1", "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-m", "graphwatch", "run", "--check-fixes", "--no-progress", "--out", "out", "train.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr  # the script's own error, as without --check-fixes
    assert "graphwatch:   patch checked" in done.stderr, done.stderr
    assert "stepped by the same optimizers" in done.stderr and "AcceleratedOptimizer" not in done.stderr
    trace = graphwatch.load(tmp_path / "out" / "trace.json")
    assert [o.label for o in trace.optimizers] == ["opt (AdamW)"]
    assert all(f.check.checked for f in trace.findings if f.check is not None)
