"""A look at many nodes of light steps' graphs at once (a holder census) walks the graph below each light
backward once, and answers which backward ran through a node as a walk towards that node does; it holds
nothing once it ends.  An episode-per-step loop whose frames hold the episode's tensors at the step's end (a
policy gradient's ``saved_actions``) is what made it quadratic: a walk of the episode's graph per node."""

from __future__ import annotations

import sys
import weakref

import pytest
import torch
from torch import nn

import graphwatch
from graphwatch.capture.graph.post_hoc import LightBackwards


def _episode(policy: nn.Module, length: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A loss over ``length`` time steps, and each time step's output (what the frames hold)."""
    outputs = [policy(torch.randn(1, 4)).tanh().sum() for _ in range(length)]
    return torch.stack(outputs).sum(), outputs


def test_a_look_answers_as_the_walk_towards_each_node_does_and_lets_go_at_its_end() -> None:
    torch.manual_seed(0)
    policy = nn.Linear(4, 1)
    loss, outputs = _episode(policy, 30)
    other_loss, other_outputs = _episode(policy, 5)  # a graph the first backward does not reach
    losses = {0: [weakref.ref(loss)], 1: [weakref.ref(other_loss)]}
    backwards = LightBackwards(losses)
    backwards.started(0, [loss.grad_fn])
    backwards.started(1, [other_loss.grad_fn])
    nodes = [t.grad_fn for t in outputs + other_outputs] + [t.grad_fn.next_functions[0][0] for t in outputs]
    walked = [(b, backwards._reaches(b, node, node._sequence_nr())) for b in (0, 1) for node in nodes]
    references = [sys.getrefcount(node) for node in nodes]
    with backwards.looking():
        looked = [(b, backwards._reaches(b, node, node._sequence_nr())) for b in (0, 1) for node in nodes]
        assert backwards._below is not None and set(backwards._below) == {0, 1}  # (each walked once)
    assert looked == walked and sum(reached for _, reached in walked) == 2 * 30 + 5
    assert backwards._below is None and [sys.getrefcount(node) for node in nodes] == references


def policy_gradient(steps: int = 70) -> list[torch.Tensor]:
    """An episode per step; the episode's outputs kept in a list the frame holds at the step's end (cleared
    after the optimizer step, as ``del model.saved_actions[:]`` does), and the last episode's until the next
    one ends (the census of a step seen in full detail meets the graph a light step's backward freed)."""
    torch.manual_seed(0)
    policy = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(policy.parameters(), lr=0.01)
    saved_outputs: list[torch.Tensor] = []
    last_episode: list[torch.Tensor] = []
    for step in range(steps):
        loss, outputs = _episode(policy, 10 + step % 7)
        saved_outputs += outputs
        opt.zero_grad()
        loss.backward()
        opt.step()
        del saved_outputs[:]
        last_episode = outputs
    del last_episode
    return [p.detach().clone() for p in policy.parameters()]


def test_a_census_among_light_episodes_records_what_it_recorded_walking_towards_each_node(
    monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    """The same loop with looks, and with every node walked towards: the same records of the nodes the census
    met (their backward, whether it freed them), the same parameters."""

    def run() -> tuple[list[tuple], list[torch.Tensor]]:
        with graphwatch.watch(summary=False, snapshots="off", keep_steps=10_000) as gw:
            params = policy_gradient()
        first = min(n.seq for n in gw.trace.nodes.values())
        nodes = sorted(repr((n.step, n.seq - first, n.op, n.backward, n.freed_by)) for n in gw.trace.nodes.values())
        return nodes, params

    looked, params = run()
    monkeypatch.setattr(LightBackwards, "_below", None, raising=False)
    monkeypatch.setattr(LightBackwards, "looking", _no_look)
    walked, params_walked = run()
    assert looked == walked and any(not n.endswith("None)") for n in looked)
    assert all(torch.equal(a, b) for a, b in zip(params, params_walked))


class _NoLook:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _no_look(self: LightBackwards) -> _NoLook:
    return _NoLook()
