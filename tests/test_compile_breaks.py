"""torch.compile inside a session compiles exactly as without one: the same graph breaks, the same
number of graphs, no new warnings, the same numbers, at every level.

graphwatch's hooks run from inside torch, also in the eager parts of a
compiled function; Dynamo must never try to compile graphwatch's own frames
(it would warn about ``sys._getframe`` and break graphs), and the precise
level's TorchFunctionMode must vanish from what Dynamo traces.  The
``aot_eager`` backend runs the same Dynamo and AOTAutograd paths as inductor
in a few seconds.
"""

from __future__ import annotations

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


def compile_stats(program: Callable[[], list[torch.Tensor]], level: str | None) -> dict[str, Any]:
    """Run ``program`` from a fresh Dynamo state, bare (``level=None``) or in a session; return what
    Dynamo counted, the warnings raised and the tensors the program returned."""
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


@pytest.mark.parametrize("program", [train_step_with_backward_inside, compiled_gru_cell_loop])
@pytest.mark.parametrize("level", LEVELS)
def test_compiling_inside_a_session_breaks_and_warns_as_bare_torch(program, level, same_tensors):
    bare = compile_stats(program, None)
    watched = compile_stats(program, level)
    assert sum(watched["breaks"].values()) == sum(bare["breaks"].values()), (bare["breaks"], watched["breaks"])
    assert watched["graphs"] == bare["graphs"]
    assert watched["warnings"] == bare["warnings"]
    same_tensors(dict(enumerate(bare["tensors"])), dict(enumerate(watched["tensors"])))


def test_default_level_breaks_graphs_for_the_same_reasons_as_bare_torch():
    """Not just as many breaks: the same ones (the precise level's mode reroutes Tensor.backward through
    ``torch.autograd.backward``, so only the count is compared there)."""
    bare = compile_stats(train_step_with_backward_inside, None)
    watched = compile_stats(train_step_with_backward_inside, "default")
    assert watched["breaks"] == bare["breaks"]
