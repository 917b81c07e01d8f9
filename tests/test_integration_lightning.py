"""PyTorch Lightning under ``GraphwatchCallback``: real ``Trainer.fit`` runs on CPU, a few batches each.

Buggy modules are diagnosed with the right kind and the user's line, correct ones report nothing, and
the callback changes no parameter (checked against the same fit without it).
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

pytest.importorskip("lightning")
import lightning.pytorch as pl
from lightning.pytorch.loggers import CSVLogger

import graphwatch
from graphwatch.integrations.lightning import GraphwatchCallback


def data(batches: int = 5) -> DataLoader:
    torch.manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(batches * 4, 6), torch.randn(batches * 4, 1)), batch_size=4)


def line_of(code: type | Callable[..., object], text: str) -> str:
    """``file:line`` of the line of ``code`` (a class or a function) that holds ``text``."""
    lines, first = inspect.getsourcelines(code)
    number = next(first + i for i, line in enumerate(lines) if text in line)
    return f"{os.path.relpath(inspect.getsourcefile(code) or '')}:{number}"


class Recurrent(pl.LightningModule):
    """Carries a hidden state from batch to batch; ``detach`` says whether it is cut."""

    def __init__(self, detach: bool) -> None:
        super().__init__()
        self.cell, self.head, self.detach_state = nn.RNNCell(6, 8), nn.Linear(8, 1), detach
        self.hidden = torch.zeros(4, 8)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        hidden = self.hidden.detach() if self.detach_state else self.hidden
        self.hidden = self.cell(x, hidden)  # the carried state
        return nn.functional.mse_loss(self.head(self.hidden), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class RecurrentLSTM(pl.LightningModule):
    """Keeps an LSTM's ``(h, c)`` on the module from batch to batch, never detached."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm, self.head = nn.LSTM(6, 8, batch_first=True), nn.Linear(8, 1)
        self.hidden: tuple[torch.Tensor, torch.Tensor] | None = None

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        out, self.hidden = self.lstm(x.unsqueeze(1), self.hidden)  # the carried state
        return nn.functional.mse_loss(self.head(out[:, -1]), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class KeepsOutputs(pl.LightningModule):
    """Appends each step's loss tensor to a list on the module."""

    def __init__(self, keep_graph: bool) -> None:
        super().__init__()
        self.net, self.keep_graph, self.outputs = nn.Linear(6, 1), keep_graph, []

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = nn.functional.mse_loss(self.net(batch[0]), batch[1])
        self.outputs.append(loss if self.keep_graph else loss.detach())  # the kept losses
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class ManualRecurrent(pl.LightningModule):
    """Manual optimization that carries its hidden state from batch to batch without detaching it."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.cell, self.head = nn.RNNCell(6, 8), nn.Linear(8, 1)
        self.hidden = torch.zeros(4, 8)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        opt = self.optimizers()
        self.hidden = self.cell(batch[0], self.hidden)  # the carried state
        loss = nn.functional.mse_loss(self.head(self.hidden), batch[1])
        opt.zero_grad()
        self.manual_backward(loss)  # the backward
        opt.step()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class TwoOptimizers(pl.LightningModule):
    """Manual optimization with two optimizers (a GAN-like alternation), done right."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.g, self.d = nn.Linear(6, 6), nn.Linear(6, 1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        opt_g, opt_d = self.optimizers()
        fake = self.g(batch[0])
        d_loss = self.d(fake.detach()).pow(2).mean() - self.d(batch[0]).mean()
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        g_loss = -self.d(fake).mean()
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [torch.optim.SGD(self.g.parameters(), lr=0.01), torch.optim.SGD(self.d.parameters(), lr=0.01)]


def fit(module: pl.LightningModule, tmp_path: Path, callback: GraphwatchCallback | None, **options: object) -> pl.Trainer:
    options = {"logger": False, **options}
    trainer = pl.Trainer(
        max_epochs=1, accelerator="cpu", devices=1, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
        callbacks=[callback] if callback is not None else [], **options,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers and logging
        trainer.fit(module, data())
    return trainer


def watched(module: pl.LightningModule, tmp_path: Path, **options: object) -> GraphwatchCallback:
    callback = GraphwatchCallback(out=tmp_path / "report")
    fit(module, tmp_path, callback, **options)
    assert callback.session is not None and not callback.session.active
    return callback


def test_a_hidden_state_kept_on_the_module_without_detach_is_named_with_its_line(tmp_path: Path) -> None:
    """The second batch's backward runs into the first's freed graph: torch's error, explained."""
    callback = GraphwatchCallback(out=tmp_path / "report")
    with pytest.raises(RuntimeError, match="backward through the graph a second time") as raised:
        fit(Recurrent(detach=False), tmp_path, callback)
    assert "carried into step 1 by `self.hidden`" in str(raised.value)
    # Lightning's loop calls the backward: it is named by the user's line that runs that loop, not Lightning's
    assert f"the backward at {line_of(fit, 'trainer.fit(module, data())')} " in str(raised.value)
    assert "lightning/" not in str(raised.value) and "-packages" not in str(raised.value)
    assert callback.session is not None and not callback.session.active
    carried = next(f for f in callback.session.findings if f.kind == "graph-carried-across-steps")
    assert carried.evidence["carrier"] == "self.hidden"
    assert line_of(Recurrent, "# the carried state") in carried.evidence["sites"]
    assert carried.fix.startswith("`self.hidden = self.hidden.detach()` at the start of each step")
    assert (tmp_path / "report" / "index.html").is_file()


@pytest.mark.parametrize("module", [lambda: Recurrent(detach=False), ManualRecurrent], ids=["automatic", "manual"])
def test_findings_cite_the_users_lines_never_lightnings(module: Callable[[], pl.LightningModule], tmp_path: Path) -> None:
    """The backward runs inside Lightning's loop (``loss.backward`` in its package): every line a finding
    cites, in its sites, message, fix and patch, is the user's; with manual optimization, the
    ``self.manual_backward(loss)`` line of ``training_step``."""
    callback = GraphwatchCallback(out=tmp_path / "report")
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        fit(module(), tmp_path, callback)
    findings = callback.session.findings  # type: ignore[union-attr]
    carried = next(f for f in findings if f.kind == "graph-carried-across-steps")
    assert carried.fix.startswith("`self.hidden = self.hidden.detach()` at the start of each step")
    for finding in findings:
        shown = " ".join([*finding.evidence["sites"], finding.message, finding.fix, finding.patch or ""])
        assert "lightning/" not in shown and "-packages" not in shown, shown
    if isinstance(module, type):  # manual optimization: the user's own backward call
        assert f"the backward at {line_of(ManualRecurrent, '# the backward')} " in carried.message
    # the detach, first in training_step (which runs once per step), also where training_step calls the
    # backward itself (`self.manual_backward(loss)`, in no loop of training_step: the patch was lost)
    assert carried.patch is not None and "+        self.hidden = self.hidden.detach()" in carried.patch


def test_an_lstm_state_kept_on_the_module_is_named_as_the_attribute(tmp_path: Path) -> None:
    """Not ``out`` (the first name the line assigns): the attribute whose value this step made from the last."""
    callback = GraphwatchCallback(out=tmp_path / "report")
    with pytest.raises(RuntimeError, match="backward through the graph a second time") as raised:
        fit(RecurrentLSTM(), tmp_path, callback)
    assert "carried into step 1 by `self.hidden`" in str(raised.value)
    carried = next(f for f in callback.session.findings if f.kind == "graph-carried-across-steps")  # type: ignore[union-attr]
    assert carried.evidence["carrier"] == "self.hidden"
    assert line_of(RecurrentLSTM, "# the carried state") in carried.evidence["sites"]
    # self.hidden starts as None (set so in __init__): the detach must not crash the first step
    assert carried.fix.startswith(
        "`if self.hidden is not None: self.hidden = tuple(h.detach() for h in self.hidden)` at the start of each step"
    )


def test_losses_appended_to_a_list_on_the_module_are_named(tmp_path: Path) -> None:
    callback = watched(KeepsOutputs(keep_graph=True), tmp_path)
    kept = next(f for f in callback.session.findings if f.kind == "graph-kept-alive")  # type: ignore[union-attr]
    assert kept.evidence["holder"].split("[")[0].endswith("outputs")
    assert line_of(KeepsOutputs, "# the kept losses") in kept.evidence["sites"]
    assert "loss.detach()" in kept.fix or ".item()" in kept.fix


def test_strict_fails_the_fit_at_the_first_leaking_step_and_writes_the_report(tmp_path: Path) -> None:
    callback = GraphwatchCallback(strict=True, out=tmp_path / "report")
    with pytest.raises(graphwatch.GraphLeakError, match="graph-kept-alive") as raised:
        fit(KeepsOutputs(keep_graph=True), tmp_path, callback)
    assert callback.session is not None and not callback.session.active
    assert raised.value.findings[0].kind == "graph-kept-alive"
    assert callback.session.trace.ended_early.startswith("GraphLeakError")
    assert (tmp_path / "report" / "index.html").is_file()


def test_the_report_goes_to_the_log_dir_of_the_trainers_logger(tmp_path: Path) -> None:
    callback = GraphwatchCallback()
    trainer = fit(KeepsOutputs(keep_graph=False), tmp_path, callback, logger=CSVLogger(tmp_path / "logs"))
    assert trainer.log_dir is not None
    assert (Path(trainer.log_dir) / "graphwatch" / "index.html").is_file()
    assert callback.session is not None and callback.session.findings == []


def test_inside_a_session_already_watching_the_callback_marks_its_steps(tmp_path: Path) -> None:
    """As under ``graphwatch run``: the callback uses that session and leaves it to its owner."""
    with graphwatch.watch(summary=False) as gw:
        callback = GraphwatchCallback(out=tmp_path / "unused")
        fit(KeepsOutputs(keep_graph=False), tmp_path, callback, accumulate_grad_batches=2)
        assert callback.session is gw and gw.active
    assert len(gw.trace.steps) == 3 and gw.findings == []
    assert not (tmp_path / "unused").exists()


@pytest.mark.parametrize(
    ("module", "options"),
    [(lambda: Recurrent(detach=True), {}), (lambda: KeepsOutputs(keep_graph=False), {"accumulate_grad_batches": 2}),
     (TwoOptimizers, {})],
    ids=["detached-state", "accumulation", "manual-two-optimizers"],
)
def test_correct_modules_report_nothing(module, options, tmp_path: Path) -> None:
    callback = watched(module(), tmp_path, **options)
    assert callback.session.findings == []  # type: ignore[union-attr]


def test_steps_are_lightnings_training_steps(tmp_path: Path) -> None:
    accumulated = watched(KeepsOutputs(keep_graph=False), tmp_path, accumulate_grad_batches=2)
    assert len(accumulated.session.trace.steps) == 3  # type: ignore[union-attr]  # 5 batches, 2 per step
    manual = watched(TwoOptimizers(), tmp_path)
    assert len(manual.session.trace.steps) == 5  # type: ignore[union-attr]  # a batch each, two optimizers


def test_the_report_goes_to_the_trainers_log_dir_by_default(tmp_path: Path) -> None:
    callback = GraphwatchCallback()
    fit(KeepsOutputs(keep_graph=False), tmp_path, callback)
    assert (tmp_path / "graphwatch" / "index.html").is_file()  # default_root_dir: no logger here
    assert (tmp_path / "graphwatch" / "trace.json").is_file()


@pytest.mark.parametrize(
    ("module", "options"),
    [(lambda: Recurrent(detach=True), {}), (lambda: Recurrent(detach=True), {"accumulate_grad_batches": 2}),
     (TwoOptimizers, {})],
    ids=["automatic", "accumulation", "manual-two-optimizers"],
)
def test_the_callback_changes_no_parameter(module, options, tmp_path: Path) -> None:
    results = []
    for callback in (None, GraphwatchCallback(out=tmp_path / "report")):
        torch.manual_seed(1)
        fitted = module()
        fit(fitted, tmp_path, callback, **options)
        results.append([p.detach().clone() for p in fitted.parameters()])
    assert len(results[0]) == len(results[1]) > 0
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_without_the_callback_a_session_counts_optimizer_steps_once_one_ran(tmp_path: Path) -> None:
    """As ``graphwatch run`` on a script that calls ``trainer.fit(...)``: no loop of the user's is around the
    backwards, so the source cannot tell where an iteration ends (README, "How steps are counted").  An
    optimizer step ends a step, and a backward does only before any optimizer stepped: the micro-batches of an
    accumulation are one step with their optimizer step, not a step each."""
    module = KeepsOutputs(keep_graph=False)
    with graphwatch.watch(summary=False) as gw:
        fit(module, tmp_path, None, accumulate_grad_batches=2)  # 5 batches: optimizer steps after 2, 4 and 5
    assert [len(step.backwards) for step in gw.trace.steps] == [1, 1, 2, 1]
    assert [step.optimizer_steps for step in gw.trace.steps] == [0, 1, 1, 1]
