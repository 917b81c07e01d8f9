"""Suggested fixes never break training: ``no_grad`` only where no backward uses the forward."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn

import graphwatch


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)))  # at: forward


def validation_history(iterations: int = 8, retain_graph: bool = False) -> None:
    """``retain_graph``: every training backward keeps its graph, so that no backward frees a training tensor."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    history = []
    x_val = torch.randn(32, 4)
    for _ in range(iterations):
        opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward(retain_graph=retain_graph)
        opt.step()
        val_loss = model(x_val).pow(2).mean()  # at: validation
        history.append(val_loss)


def training_losses_kept(iterations: int = 8) -> None:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for _ in range(iterations):
        opt.zero_grad()
        loss = model(torch.randn(8, 4)).pow(2).mean()  # at: training
        loss.backward()
        opt.step()
        losses.append(loss)


def train_epoch(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()


def evaluate(model: nn.Module, x_val: torch.Tensor) -> torch.Tensor:
    total = torch.zeros(())
    for chunk in x_val.split(8):
        total = total + model(chunk).pow(2).mean()  # at: evaluation
    return total


def validation_in_its_own_function(epochs: int = 6) -> None:
    """PyTorch's word-language-model's shape: the epoch loop calls a training function, then an evaluation
    function (here without ``no_grad``), and keeps what it returns."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x_val = torch.randn(32, 4)
    history = []
    for _ in range(epochs):
        train_epoch(model, opt)
        history.append(evaluate(model, x_val))


def kept_finding(program: Callable[[], None]) -> graphwatch.Finding:
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        program()
    return next(f for f in gw.findings if f.kind == "graph-kept-alive")


def test_validation_through_a_user_module_gets_no_grad_at_the_loops_call(at: Callable[[object, str], str]) -> None:
    finding = kept_finding(validation_history)
    assert finding.fix.startswith(f"run the forward at {at(validation_history, 'validation')} under `with torch.no_grad():`")
    assert at(Net.forward, "forward") not in finding.fix  # the module's forward also trains


def test_validation_in_a_function_the_training_loop_never_calls_gets_no_grad_there_not_in_the_model(
    at: Callable[[object, str], str],
) -> None:
    finding = kept_finding(validation_in_its_own_function)
    assert finding.fix.startswith(f"run the forward at {at(evaluate, 'evaluation')} under `with torch.no_grad():`")
    assert at(Net.forward, "forward") not in finding.fix  # the module's forward also trains
    assert finding.patch is not None and "     def forward" not in finding.patch


def test_validation_beside_retained_training_graphs_gets_no_grad_at_its_own_line(
    at: Callable[[object, str], str],
) -> None:
    finding = kept_finding(functools.partial(validation_history, retain_graph=True))
    assert finding.fix.startswith(f"run the forward at {at(validation_history, 'validation')} ")
    assert at(Net.forward, "forward") not in finding.fix  # what the retained graphs ran through trains


def test_kept_training_losses_never_get_no_grad(at: Callable[[object, str], str]) -> None:
    finding = kept_finding(training_losses_kept)
    assert "no_grad" not in finding.fix
    assert at(training_losses_kept, "training") not in finding.fix
    assert "`losses.append(loss.item())`" in finding.fix
