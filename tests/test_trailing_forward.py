"""Forwards after the last step (a final ``predict()``, a last evaluation), with no backward and no optimizer
step after them, are not a step of their own, at every level (issue 39), unless graphs of earlier steps are
still held when the session ends: then they are the step those are seen kept at, so no finding is lost.

The shapes are those of PyTorch's ``mnist_forward_forward`` (a loop of optimizer steps, then a ``predict()``
of forwards only) and of an evaluation after each optimizer step that keeps its graphs.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import graphwatch

LEVELS = ("full", "default", "light")


def watch(level: str) -> graphwatch.Session:
    return graphwatch.watch(summary=False, snapshots="off", level=level)


def forward_forward(steps: int, layer: nn.Linear) -> torch.Tensor:
    """Trains ``layer`` for ``steps`` optimizer steps, then predicts (forwards only, outside ``no_grad``)."""
    opt = torch.optim.Adam(layer.parameters(), lr=0.01)
    x_pos, x_neg = torch.randn(16, 4), torch.randn(16, 4)
    for _ in range(steps):
        g_pos, g_neg = layer(x_pos).relu().pow(2).mean(1), layer(x_neg).relu().pow(2).mean(1)
        loss = torch.log(1 + torch.exp(torch.cat([2 - g_pos, g_neg - 2]))).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return predict(layer, x_pos)


def predict(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return layer(x).relu().pow(2).mean(1)


@pytest.mark.parametrize("level", LEVELS)
def test_a_final_predict_after_the_last_optimizer_step_is_not_a_step(level: str, no_session_left: None) -> None:
    torch.manual_seed(0)
    with watch(level) as gw:
        goodness = forward_forward(6, nn.Linear(4, 8))
    assert goodness.grad_fn is not None  # the predict made a graph: it ran after the last step, watched
    assert len(gw.trace.steps) == 6 and gw.findings == []
    assert [s.optimizer_steps for s in gw.trace.steps] == [1] * 6


def evaluate_each_step(steps: int) -> list[torch.Tensor]:
    """Evaluates after each optimizer step outside ``no_grad`` and keeps the losses: their graphs stay alive."""
    model, x_val = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)), torch.randn(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    val_losses = []
    for _ in range(steps):
        loss = model(torch.randn(4, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        val_losses.append(model(x_val).pow(2).mean())  # at: kept
    return val_losses


@pytest.mark.parametrize("level", ("full", "default"))
def test_an_evaluation_that_keeps_its_graphs_is_still_found_when_its_last_pass_ends_the_run(
    level: str, at: Callable[[object, str], str], no_session_left: None
) -> None:  # fmt: skip
    torch.manual_seed(0)
    with watch(level) as gw:
        val_losses = evaluate_each_step(8)
    # graphs of earlier steps outlive the loop: the last evaluation is the step they are seen kept at the end of
    assert len(gw.trace.steps) == 9 and gw.trace.steps[8].optimizer_steps == 0
    kept = [f for f in gw.findings if f.kind == "graph-kept-alive"]
    assert kept and kept[0].evidence["holder"].startswith("val_losses") and len(val_losses) == 8
    assert at(evaluate_each_step, "kept") in kept[0].evidence["sites"]


def test_a_backward_after_the_last_optimizer_step_is_still_a_step(no_session_left: None) -> None:
    torch.manual_seed(0)
    layer = nn.Linear(4, 8)
    with watch("full") as gw:
        forward_forward(3, layer).sum().backward()  # a last backward (a gradient check): the run's own step
    assert len(gw.trace.steps) == 4 and gw.trace.steps[3].backwards and gw.trace.steps[3].optimizer_steps == 0


def test_an_error_in_a_forward_after_the_last_step_still_closes_a_step_of_its_own(no_session_left: None) -> None:
    torch.manual_seed(0)
    layer = nn.Linear(4, 8)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"), watch("full") as gw:
        forward_forward(3, layer)
        predict(layer, predict(layer, torch.randn(2, 4)).unsqueeze(0))  # a forward that fails: where the run ends
    assert len(gw.trace.steps) == 4 and gw.trace.ended_early and "RuntimeError" in gw.trace.ended_early
