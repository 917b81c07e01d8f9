"""torch.compile inside a session compiles exactly as without one: the same graph breaks, the same
number of graphs, no new warnings, the same numbers, at every level.

graphwatch's hooks run from inside torch, also in the eager parts of a
compiled function; Dynamo must never try to compile graphwatch's own frames
(it would warn about ``sys._getframe`` and break graphs), and the precise
level's TorchFunctionMode must vanish from what Dynamo traces.  The
``aot_eager`` backend runs the same Dynamo and AOTAutograd paths as inductor
(the compiled graph's backward is one autograd Function whose saved tensors
graphwatch's hooks pack) in a few seconds; inductor only generates other
kernels for the same graphs, and takes minutes to compile here.  The recurrent
programs compare every gradient with the state carried from one compiled
call to the next (backwards through earlier calls' graphs) and detached.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn as nn
from torch._dynamo.utils import counters

import graphwatch

pytestmark = pytest.mark.usefixtures("no_session_left")

LEVELS = ("light", "default", "precise")


@functools.cache
def compile_stats(program: Callable[[], list[torch.Tensor]], level: str | None) -> dict[str, Any]:
    """Run ``program`` from a fresh Dynamo state, bare (``level=None``) or in a session; return what
    Dynamo counted, the warnings raised and the tensors the program returned.  Once per program and level
    (compiling takes seconds; the bare run is the same for every level, and tests that assert different
    things of one run share it)."""
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if level is None:
            tensors = program()
        else:
            with graphwatch.watch(level=level, summary=False):
                tensors = program()
    stats = {
        "breaks": {reason.splitlines()[0]: n for reason, n in counters["graph_break"].items()},
        "graphs": counters["stats"]["unique_graphs"],
        "warnings": sorted({str(w.message).splitlines()[0] for w in caught}),
        "tensors": tensors,
    }
    torch._dynamo.reset()
    return stats


def train_step_with_backward_inside() -> list[torch.Tensor]:
    """A compiled step that calls ``loss.backward()``: one graph break in bare torch."""
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    @torch.compile(backend="aot_eager")
    def train_step(x: torch.Tensor) -> torch.Tensor:
        loss = model(x).pow(2).mean()
        loss.backward()
        return loss

    losses = []
    for _ in range(3):
        losses.append(train_step(torch.randn(4, 8)).detach())
        opt.step()
        opt.zero_grad()
    return losses + [p.detach().clone() for p in model.parameters()]


def compiled_gru_cell_loop() -> list[torch.Tensor]:
    """A compiled GRUCell step in an eager loop that carries (and detaches) the hidden state."""
    cell, head = nn.GRUCell(8, 16), nn.Linear(16, 1)
    opt = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=0.1)

    @torch.compile(backend="aot_eager")
    def step(x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = cell(x, h)
        return head(h).pow(2).mean(), h

    hidden, losses = torch.zeros(4, 16), []
    for _ in range(3):
        loss, hidden = step(torch.randn(4, 8), hidden)
        loss.backward()
        opt.step()
        opt.zero_grad()
        hidden = hidden.detach()
        losses.append(loss.detach())
    return losses + [p.detach().clone() for p in cell.parameters()]


def carried_then_detached(
    model: nn.Module, step: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]], state: torch.Tensor
) -> list[torch.Tensor]:
    """Three iterations that carry the state from one compiled call to the next (each backward retains the
    graph and goes back through the earlier calls; one optimizer step at the end), then three that detach it
    (a step each).  Returns every gradient each backward left, then the parameters."""
    opt, start, tensors = torch.optim.SGD(model.parameters(), lr=0.1), state, []
    for carry in (True, False):
        state = start
        for _ in range(3):
            loss, state = step(torch.randn(4, 3, 8), state)
            loss.backward(retain_graph=carry)
            tensors += [p.grad.clone() for p in model.parameters() if p.grad is not None]
            if not carry:
                opt.step()
                opt.zero_grad()
                state = state.detach()
        if carry:
            opt.step()
            opt.zero_grad()
    return tensors + [p.detach().clone() for p in model.parameters()]


def compiled_lstm_over_a_sequence() -> list[torch.Tensor]:
    """An LSTM cell unrolled over three time steps inside one compiled function (nn.LSTM itself is a graph break
    in Dynamo), its (h, c) state carried, then detached."""
    cell, head = nn.LSTMCell(8, 16), nn.Linear(16, 1)

    @torch.compile(backend="aot_eager")
    def step(xs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h, c = state.unbind(0)
        for x in xs.unbind(1):
            h, c = cell(x, (h, c))
        return head(h).pow(2).mean(), torch.stack([h, c])

    return carried_then_detached(nn.ModuleList([cell, head]), step, torch.zeros(2, 4, 16))


def compiled_transformer_block() -> list[torch.Tensor]:
    """A compiled transformer encoder block that attends over its last outputs (a memory, carried, then
    detached) and the new inputs."""
    block = nn.Sequential(nn.Linear(8, 16), nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True))

    @torch.compile(backend="aot_eager")
    def step(x: torch.Tensor, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = block[1](torch.cat([memory, block[0](x)], dim=1))
        return out.pow(2).mean(), out[:, -2:]

    return carried_then_detached(block, step, torch.zeros(4, 2, 16))


PROGRAMS = [train_step_with_backward_inside, compiled_gru_cell_loop, compiled_lstm_over_a_sequence,
            compiled_transformer_block]  # fmt: skip


def shares_the_runs_of(program: Callable[[], list[torch.Tensor]]) -> pytest.MarkDecorator:
    """The tests of one program run on one worker (``--dist loadgroup``): its bare run is made once."""
    return pytest.mark.xdist_group(f"compile-{program.__name__}")


@pytest.mark.parametrize("program", [pytest.param(p, marks=shares_the_runs_of(p), id=p.__name__) for p in PROGRAMS])
@pytest.mark.parametrize("level", LEVELS)
def test_compiling_inside_a_session_breaks_and_warns_as_bare_torch(program, level, same_tensors):
    bare = compile_stats(program, None)
    watched = compile_stats(program, level)
    assert sum(watched["breaks"].values()) == sum(bare["breaks"].values()), (bare["breaks"], watched["breaks"])
    assert watched["graphs"] == bare["graphs"]
    assert watched["warnings"] == bare["warnings"]
    same_tensors(dict(enumerate(bare["tensors"])), dict(enumerate(watched["tensors"])))


@shares_the_runs_of(train_step_with_backward_inside)
def test_default_level_breaks_graphs_for_the_same_reasons_as_bare_torch():
    """Not just as many breaks: the same ones (the precise level's mode reroutes Tensor.backward through
    ``torch.autograd.backward``, so only the count is compared there)."""
    bare = compile_stats(train_step_with_backward_inside, None)
    watched = compile_stats(train_step_with_backward_inside, "default")
    assert watched["breaks"] == bare["breaks"]
