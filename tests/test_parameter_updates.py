"""A saved parameter changed in place by an update the user wrote (no optimizer): torch's "modified by an inplace
operation" error is explained with the update's line, and the fix keeps the update (out of place, or on a copy,
the parameter would not train): a graph of an earlier step reached again is cut where it is carried; a backward
after the update in the same step goes before it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import graphwatch

_OUT_OF_PLACE = ("instead of x.add_(1)", ".clone() it first", "p = p -", "w = w -")


def carried_rnn(steps: int = 4) -> None:
    """The hidden state is never detached and each backward retains the graph; the update is by hand."""
    torch.manual_seed(0)
    cell, head = nn.RNNCell(3, 4), nn.Linear(4, 1)
    params = [*cell.parameters(), *head.parameters()]
    h = torch.zeros(2, 4)
    for _ in range(steps):
        h = cell(torch.randn(2, 3), h)  # at: carried
        loss = head(h).pow(2).mean()
        loss.backward(retain_graph=True)  # at: backward
        with torch.no_grad():
            for p in params:
                p -= 0.01 * p.grad  # at: update
                p.grad = None


def carried_leaves() -> None:
    """Two trained leaves, updated by name: the one the graph saved is named."""
    torch.manual_seed(0)
    w = torch.randn(4, 4, requires_grad=True)
    u = torch.randn(3, 4, requires_grad=True)
    x = torch.randn(8, 3)
    state = torch.zeros(8, 4)
    for _ in range(4):
        state = torch.tanh(state @ w + x @ u)
        loss = state.pow(2).mean()
        loss.backward(retain_graph=True)
        with torch.no_grad():
            w -= 0.1 * w.grad  # at: w-update
            u -= 0.1 * u.grad
            w.grad = u.grad = None


class Stepper:
    """A ``train_step`` called once a step: the backward and the update are in it, the loop is its caller's."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.cell, self.head = nn.RNNCell(3, 4), nn.Linear(4, 1)
        self.h = torch.zeros(2, 4)

    def train_step(self) -> None:
        self.h = self.cell(torch.randn(2, 3), self.h)
        self.head(self.h).pow(2).mean().backward(retain_graph=True)
        with torch.no_grad():
            for p in [*self.cell.parameters(), *self.head.parameters()]:
                p.sub_(0.01 * p.grad)  # at: step-update
                p.grad = None


def stepped() -> None:
    stepper = Stepper()
    for _ in range(4):
        stepper.train_step()


def second_loss_after_update() -> None:
    """A second loss of the same forward is backwarded after the update."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))  # (the last layer saves weight.t(): a view)
    x = torch.randn(8, 3)
    for _ in range(3):
        out = model(x)
        loss_a, loss_b = out.pow(2).mean(), out.abs().mean()
        loss_a.backward(retain_graph=True)
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad  # at: same-step-update
                p.grad = None
        loss_b.backward()  # at: late-backward


def detached_until(first_kept: int = 40) -> None:
    """The hidden state is detached at every step before ``first_kept`` (each backward retains its graph)."""
    torch.manual_seed(0)
    cell, head = nn.RNNCell(3, 4), nn.Linear(4, 1)
    params = [*cell.parameters(), *head.parameters()]
    h = torch.zeros(2, 4)
    for step in range(first_kept + 10):
        if step < first_kept:
            h = h.detach()
        h = cell(torch.randn(2, 3), h)
        loss = head(h).pow(2).mean()
        loss.backward(retain_graph=True)
        with torch.no_grad():
            for p in params:
                p -= 0.01 * p.grad  # at: light-update
                p.grad = None


def raised(train: Callable[[], Any]) -> tuple[str, graphwatch.Session]:
    """The error's text under a session (torch's own first, as a bare run raises it) and the session."""
    with pytest.raises(RuntimeError) as bare:
        train()
    with graphwatch.watch(summary=False, snapshots="off") as gw, pytest.raises(RuntimeError) as watched:
        train()
    text = str(watched.value)
    assert text.startswith(str(bare.value) + "\n\ngraphwatch: the tensor was saved at ")
    assert not any(words in text for words in _OUT_OF_PLACE)
    return text, gw


def test_an_earlier_steps_graph_reached_after_a_hand_written_update_names_the_update_and_the_carried_graph(
    at: Callable[[Callable[..., Any], str], str],
) -> None:
    text, gw = raised(carried_rnn)
    update = at(carried_rnn, "update")
    assert f"saved at {at(carried_rnn, 'carried')}" in text and "(step 1), a parameter, then updated in place at " in text
    assert f"{update} (`p -= 0.01 * p.grad" in text
    assert f"step 2's backward at {at(carried_rnn, 'backward')}" in text and "runs into step 1's graph again" in text
    assert "cut what carries the graph into the next step" in text and "the update itself is right" in text
    # the graph carried across steps is the cause, with its own finding and patch (as for an optimizer's step)
    assert [f.kind for f in gw.findings] == ["graph-carried-across-steps"]


def test_of_two_leaves_updated_by_name_the_one_the_graph_saved_is_named(
    at: Callable[[Callable[..., Any], str], str],
) -> None:
    text, _ = raised(carried_leaves)
    assert f"then updated in place at {at(carried_leaves, 'w-update')} (`w -= 0.1 * w.grad" in text
    assert "u -= 0.1" not in text  # (the other leaf's update changed no tensor this graph saved)


def test_a_train_step_function_with_the_backward_and_the_update_has_the_update_named(
    at: Callable[[Callable[..., Any], str], str],
) -> None:
    text, _ = raised(stepped)
    assert f"then updated in place at {at(Stepper.train_step, 'step-update')} (`p.sub_(0.01 * p.grad)" in text
    assert "runs into step 1's graph again" in text


def test_a_backward_after_the_update_in_the_same_step_goes_before_it_and_no_edit_is_offered(
    at: Callable[[Callable[..., Any], str], str],
) -> None:
    text, gw = raised(second_loss_after_update)
    update = at(second_loss_after_update, "same-step-update")
    assert f"then updated in place at {update} (`p -= 0.1 * p.grad" in text
    assert f"the backward at {at(second_loss_after_update, 'late-backward')}" in text
    assert f"run this backward before the update at {update}" in text
    [finding] = [f for f in gw.findings if f.kind == "modified-in-place"]
    assert finding.remedies and not any(r.edits or r.mechanical for r in finding.remedies)
    assert finding.patch is None and finding.evidence["changed_at"] == update


def test_on_a_step_seen_light_the_update_is_named_as_on_a_full_step(at: Callable[[Callable[..., Any], str], str]) -> None:
    """Step 41, seen light at the default level, is the first to reach a graph of the step before that saved a
    weight (step 40's cell had a hidden state with a graph: step 39's had none): the error is explained from the
    graph still alive, as on a full step."""
    text, gw = raised(detached_until)
    assert len(gw.trace.steps) == 42 and not any(s.first <= 41 < s.end for s in gw.trace.full_detail)
    assert f"then updated in place at {at(detached_until, 'light-update')}" in text
    assert "step 41's backward at " in text and "runs into step 40's graph again" in text
