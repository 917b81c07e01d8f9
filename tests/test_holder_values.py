"""What a holder record knows about the value it holds, counted when it was found: the element count (a
fix uses ``.item()`` only for one), whether a backward ran through the value, and the line that assigns a
holder reached through objects (a module buffer, a policy's attribute two objects down)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

import graphwatch
from graphwatch.model import Holder


def last_holders(gw: graphwatch.Session, name: str) -> list[Holder]:
    found = [h for s in gw.trace.steps for h in s.holders if h.name.split("[")[0] == name]
    assert found, [h.name for s in gw.trace.steps for h in s.holders]
    return found[-2:]


def test_a_holder_counts_the_elements_of_what_it_holds_and_whether_a_backward_ran_through_it() -> None:
    torch.manual_seed(0)
    model = nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    logits_kept: list[torch.Tensor] = []
    losses: list[torch.Tensor] = []
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        total = torch.zeros(())
        for _ in range(6):
            logits = model(torch.randn(32, 16))
            loss = logits.pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            logits_kept.append(logits)
            losses.append(loss)
            total = total + loss.detach() * model(torch.randn(1, 16)).sum()
    assert {(h.numel, h.backwarded) for h in last_holders(gw, "logits_kept")} == {(32, True)}
    assert {(h.numel, h.backwarded) for h in last_holders(gw, "losses")} == {(1, True)}
    assert {(h.numel, h.backwarded) for h in last_holders(gw, "total")} == {(1, False)}


class Policy:
    def __init__(self) -> None:
        self.critic = nn.Linear(4, 1)
        self.baseline = torch.zeros(())  # at: init

    def update(self, value: torch.Tensor) -> None:
        self.baseline = 0.9 * self.baseline + 0.1 * value.mean()  # at: update


class Agent:
    def __init__(self) -> None:
        self.policy = Policy()
        self.opt = torch.optim.SGD(self.policy.critic.parameters(), lr=0.01)

    def step(self) -> None:
        value = self.policy.critic(torch.randn(8, 4))
        self.opt.zero_grad()
        value.pow(2).mean().backward()
        self.opt.step()
        self.policy.update(value)


def test_an_attribute_two_objects_down_is_named_at_the_line_that_assigns_it_each_step(at: Callable[[object, str], str]) -> None:
    torch.manual_seed(0)
    agent = Agent()
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        for _ in range(8):
            agent.step()
    (kept,) = [f for f in gw.findings if f.kind == "graph-kept-alive"]
    assert kept.evidence["holder"] == "self.policy.baseline"  # as the innermost frame, Agent.step, names it
    assert kept.evidence["sites"][0] == at(Policy.update, "update")  # not __init__'s line
    assert kept.remedies[0].edits[0].kind == "detach-made" and kept.remedies[0].edits[0].target == "self.baseline"


class RunningMean(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("running", torch.zeros(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        self.running = 0.9 * self.running + 0.1 * y.mean(0)  # at: buffer
        return y - self.running.detach()


def test_a_module_buffer_updated_outside_no_grad_is_a_named_holder(at: Callable[[object, str], str]) -> None:
    torch.manual_seed(0)
    model = RunningMean()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        for _ in range(8):
            loss = model(torch.randn(16, 8)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    (kept,) = [f for f in gw.findings if f.kind == "graph-kept-alive"]
    assert kept.evidence["holder"] == "model.running"
    assert kept.evidence["sites"][0] == at(RunningMean.forward, "buffer")
    assert "something outside" not in kept.message


def test_a_deque_replay_buffer_and_a_modules_private_list_are_named_holders() -> None:
    """The usual RL replay buffer is a ``collections.deque``; a LightningModule keeps ``self._losses``: both are
    looked into (torch's own module internals are not)."""
    from collections import deque

    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    model._losses = []  # a private list on a module
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    replay: deque[tuple[torch.Tensor, torch.Tensor]] = deque(maxlen=50)
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        for _ in range(6):
            x = torch.randn(4, 8)
            out = model(x)
            loss = out.pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            replay.append((x, out))
            model._losses.append(loss)
    assert [h.name for h in last_holders(gw, "replay")][-1].startswith("replay[")
    assert [h.name for h in last_holders(gw, "model._losses")][-1].startswith("model._losses[")
    assert not any(h.name.startswith(("model._parameters", "model._forward_hooks")) for s in gw.trace.steps for h in s.holders)


class Recorder:
    def __init__(self) -> None:
        self.td_errors: list[torch.Tensor] = []


class Learner:
    def __init__(self) -> None:
        self.memory = Recorder()

    def remember(self, loss: torch.Tensor) -> None:
        self.memory.td_errors.append(loss)  # at: append


def test_a_list_that_its_own_class_only_creates_is_named_at_the_line_of_the_object_that_appends_to_it(
    at: Callable[[object, str], str],
) -> None:
    torch.manual_seed(0)
    net = nn.Linear(8, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    learner = Learner()
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        for _ in range(8):
            loss = net(torch.randn(4, 8)).pow(2).mean()
            learner.remember(loss)
            opt.zero_grad()
            loss.backward()
            opt.step()
    (kept,) = [f for f in gw.findings if f.kind == "graph-kept-alive"]
    assert kept.evidence["holder"] == "learner.memory.td_errors"
    assert kept.evidence["sites"][0] == at(Learner.remember, "append")  # not Recorder.__init__'s `= []`
