"""Activation checkpointing inside a session recomputes exactly as often as without one, and its
own checks (non-determinism, debug logs) fire the same way.

Each program counts how many times the checkpointed function runs (the first
call is the forward; every other one is a recomputation) and returns the
gradients; the counts and gradients must be equal bare and watched, at every
level.  Each program runs twice, as two iterations of a training loop: from
the second backward of a session on, graphwatch looks at the graph the
backward is about to run, and that look must not unpack (and so recompute)
what checkpoint's hooks saved.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

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


def backward_from_the_checkpointed_output() -> tuple[int, torch.Tensor]:
    """The backward starts at the checkpointed function's own output: its node is the first one reached."""
    calls, x = [0], torch.randn((), requires_grad=True)
    checkpoint(counted(torch.sin, calls), x, use_reentrant=False).backward()
    return calls[0], x.grad


def grads_in_two_parts() -> tuple[int, torch.Tensor]:
    """autograd.grad through the second half of a checkpointed graph, then through the first half (no execution
    group): each one recomputes."""
    calls, x = [0], torch.randn(3, requires_grad=True)

    def halves(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        first = t.sin().cos()
        return first, first.sin().cos()

    first, second = checkpoint(counted(halves, calls), x, use_reentrant=False)
    (grad_first,) = torch.autograd.grad(second, first, torch.ones(3))
    (grad_x,) = torch.autograd.grad(first, x, grad_first)
    return calls[0], grad_x


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
    "backward from the checkpointed output": (backward_from_the_checkpointed_output, 2),
    "autograd.grad in two parts": (grads_in_two_parts, 3),
    "retain_graph, two backwards": (retained_graph_backwarded_twice, 3),
}


def two_iterations(program: Callable[[], tuple[int, torch.Tensor]]) -> list[tuple[int, torch.Tensor]]:
    torch.manual_seed(0)
    return [program(), program()]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_checkpointed_functions_run_as_often_as_without_graphwatch(name, level):
    program, expected = PROGRAMS[name]
    bare = two_iterations(program)
    assert [calls for calls, _ in bare] == [expected, expected]
    with graphwatch.watch(summary=False, level=level):
        watched = two_iterations(program)
    for iteration, ((bare_calls, bare_grad), (watched_calls, watched_grad)) in enumerate(zip(bare, watched)):
        assert watched_calls == bare_calls, f"{name}, iteration {iteration}: {watched_calls} watched, {bare_calls} bare"
        assert torch.equal(watched_grad, bare_grad)


# how the recomputation differs from the forward: (forward, recomputation), each saving two or three tensors
NON_DETERMINISM: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]] = {
    "fewer tensors": (lambda x: x.sin().exp().sin(), lambda x: x.sin().exp()),
    "other shapes": (lambda x: x.sin().exp(), lambda x: x.sin() * torch.ones(2)),
}


def changes_what_it_saves(kind: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """Saves other tensors when recomputed than in the forward: checkpoint's non-determinism check fires."""
    calls, (forward, recomputation) = [0], NON_DETERMINISM[kind]

    def fn(x: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        return forward(x) if calls[0] == 1 else recomputation(x)

    return fn


@pytest.fixture
def checkpoint_debug_logger() -> Iterator[None]:
    """Put back the logger that ``set_checkpoint_debug_enabled(True)`` leaves non-propagating at INFO: pytest
    (9 and later) then adds its own capture handler to it in the next test, which cannot format its records."""
    logger = logging.getLogger("LoggingTensor")
    level, propagate, filters = logger.level, logger.propagate, list(logger.filters)
    yield
    logger.setLevel(level)
    logger.propagate = propagate
    logger.filters[:] = filters


def non_determinism_error(kind: str, debug: bool) -> str:
    one_checkpoint()  # a first iteration: the backward below is a session's second
    x = torch.randn(1, requires_grad=True)
    with pytest.raises(RuntimeError) as raised, set_checkpoint_debug_enabled(debug):
        checkpoint(changes_what_it_saves(kind), x, use_reentrant=False).backward()
    return f"{type(raised.value).__name__}: {str(raised.value).splitlines()[0]}"


@pytest.mark.usefixtures("checkpoint_debug_logger")
@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
@pytest.mark.parametrize("kind", list(NON_DETERMINISM))
def test_checkpoints_non_determinism_check_fires_as_without_graphwatch(kind, debug):
    bare = non_determinism_error(kind, debug)
    with graphwatch.watch(summary=False):
        watched = non_determinism_error(kind, debug)
    assert bare.startswith("CheckpointError")
    assert watched == bare
