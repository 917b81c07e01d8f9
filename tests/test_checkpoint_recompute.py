"""Activation checkpointing inside a session recomputes exactly as often as without one, and its
own checks (non-determinism, debug logs) fire the same way.

Each program counts how many times the checkpointed function runs (the first
call is the forward; every other one is a recomputation) and returns the
gradients; the counts and gradients must be equal bare and watched, at every
level.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch.utils.checkpoint import GraphExecGroup, checkpoint, set_checkpoint_debug_enabled, set_checkpoint_early_stop

import graphwatch

pytestmark = pytest.mark.usefixtures("no_session_left")

LEVELS = ("light", "default", "precise")


def counted(fn: Callable[[torch.Tensor], torch.Tensor], calls: list[int]) -> Callable[[torch.Tensor], torch.Tensor]:
    def run(x: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        return fn(x)

    return run


def one_checkpoint() -> tuple[int, torch.Tensor]:
    calls, x = [0], torch.randn(3, requires_grad=True)
    out = checkpoint(counted(lambda t: t.sin().exp().cos(), calls), x, use_reentrant=False)
    out.sum().backward()
    return calls[0], x.grad


def nested_checkpoints(early_stop: bool) -> tuple[int, torch.Tensor]:
    calls, x = [0], torch.randn(3, requires_grad=True)
    inner = counted(lambda t: t.sin().cos(), calls)

    def outer(t: torch.Tensor) -> torch.Tensor:
        return checkpoint(inner, t.exp(), use_reentrant=False).tanh()

    with set_checkpoint_early_stop(early_stop):
        checkpoint(outer, x, use_reentrant=False).sum().backward()
    return calls[0], x.grad


def grads_in_one_execution_group() -> tuple[int, torch.Tensor]:
    """Two autograd.grad calls over disjoint parts of one checkpointed graph share one recomputation."""
    calls, x = [0], torch.randn(4, requires_grad=True)
    a, b = checkpoint(counted(lambda t: (t.sin().exp(), t.cos().exp()), calls), x, use_reentrant=False)
    with GraphExecGroup():
        (ga,) = torch.autograd.grad(a.sum(), x, retain_graph=True)
        (gb,) = torch.autograd.grad(b.sum(), x)
    return calls[0], ga + gb


def retained_graph_backwarded_twice() -> tuple[int, torch.Tensor]:
    calls, x = [0], torch.randn(3, requires_grad=True)
    out = checkpoint(counted(lambda t: t.sin().exp(), calls), x, use_reentrant=False).sum()
    out.backward(retain_graph=True)
    out.backward()
    return calls[0], x.grad


# name: (program, how often torch runs the checkpointed function: the forward, then each recomputation)
PROGRAMS: dict[str, tuple[Callable[[], tuple[int, torch.Tensor]], int]] = {
    "one checkpoint": (one_checkpoint, 2),
    "nested, early stop": (lambda: nested_checkpoints(True), 3),
    "nested, no early stop": (lambda: nested_checkpoints(False), 3),
    "graph execution group": (grads_in_one_execution_group, 2),
    "retain_graph, two backwards": (retained_graph_backwarded_twice, 3),
}


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_checkpointed_functions_run_as_often_as_without_graphwatch(name, level):
    program, expected = PROGRAMS[name]
    torch.manual_seed(0)
    bare_calls, bare_grad = program()
    assert bare_calls == expected
    torch.manual_seed(0)
    with graphwatch.watch(summary=False, level=level):
        watched_calls, watched_grad = program()
    assert watched_calls == bare_calls, f"{name}: {watched_calls} calls under graphwatch, {bare_calls} without"
    assert torch.equal(watched_grad, bare_grad)


def changes_what_it_saves() -> Callable[[torch.Tensor], torch.Tensor]:
    """Saves three tensors the first time, two when recomputed: checkpoint's non-determinism check fires."""
    calls = [0]

    def fn(x: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        return x.sin().exp().sin() if calls[0] == 1 else x.sin().exp()

    return fn


def non_determinism_error(debug: bool) -> str:
    x = torch.randn(1, requires_grad=True)
    with pytest.raises(RuntimeError) as raised, set_checkpoint_debug_enabled(debug):
        checkpoint(changes_what_it_saves(), x, use_reentrant=False).backward()
    return f"{type(raised.value).__name__}: {str(raised.value).splitlines()[0]}"


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
def test_checkpoints_non_determinism_check_fires_as_without_graphwatch(debug):
    bare = non_determinism_error(debug)
    with graphwatch.watch(summary=False):
        watched = non_determinism_error(debug)
    assert bare.startswith("CheckpointError")
    assert watched == bare

