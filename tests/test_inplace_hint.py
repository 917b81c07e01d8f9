"""The "modified by an inplace operation" error that an optimizer step causes names that step and the cause."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import graphwatch

INPLACE = "one of the variables needed for gradient computation has been modified by an inplace operation"


def gan_reusing_d_output(steps: int = 2) -> None:
    """G's loss reuses D's output from before D's optimizer step (a common GAN ordering bug)."""
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    D = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))
    opt_d, opt_g = torch.optim.SGD(D.parameters(), lr=0.1), torch.optim.SGD(G.parameters(), lr=0.1)
    bce = nn.BCEWithLogitsLoss()
    for _ in range(steps):
        output = D(G(torch.randn(8, 4)))
        opt_d.zero_grad()
        bce(output, torch.zeros(8, 1)).backward(retain_graph=True)
        opt_d.step()  # at: d-step
        opt_g.zero_grad()
        bce(output, torch.ones(8, 1)).backward()
        opt_g.step()


def rnn_retained_across_steps(steps: int = 3) -> None:
    torch.manual_seed(0)
    cell, head = nn.RNNCell(3, 4), nn.Linear(4, 1)
    opt = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=0.1)
    h = torch.zeros(2, 4)
    for _ in range(steps):
        opt.zero_grad()
        h = cell(torch.randn(2, 3), h)
        head(h).pow(2).mean().backward(retain_graph=True)
        opt.step()  # at: rnn-step


def message(program: object) -> str:
    with pytest.raises(RuntimeError) as raised:
        program()  # type: ignore[operator]
    return str(raised.value)


def test_backward_after_the_optimizer_step_of_the_same_step_names_that_step(at: object) -> None:
    bare = message(gan_reusing_d_output)
    with graphwatch.watch(summary=False, snapshots="off"):
        text = message(gan_reusing_d_output)
    assert bare.startswith(INPLACE) and text.startswith(bare + "\n\ngraphwatch: ")  # torch's text first, unchanged
    assert f"optimizer.step() at {at(gan_reusing_d_output, 'd-step')} updated this parameter" in text  # type: ignore[operator]
    assert "Run this backward before that optimizer step, or recompute the forward" in text
    assert "Something changed it in place" not in text


def test_a_graph_reused_after_an_optimizer_step_names_the_carried_tensor(at: object) -> None:
    with graphwatch.watch(summary=False, snapshots="off"):
        text = message(rnn_retained_across_steps)
    assert text.startswith(INPLACE)
    assert f"optimizer.step() at {at(rnn_retained_across_steps, 'rnn-step')} updated this parameter" in text  # type: ignore[operator]
    assert "a graph of an earlier step is reused (carried by `h`)" in text


def test_an_inplace_change_by_the_user_keeps_the_plain_hint() -> None:
    x = torch.ones(3, requires_grad=True)
    with graphwatch.watch(summary=False, snapshots="off"):
        y = x.exp()
        y.add_(1)
        text = message(lambda: y.sum().backward())
    assert text.startswith(INPLACE) and "Something changed it in place after autograd saved it" in text
