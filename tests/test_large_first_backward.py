"""A first backward too large to draw (issue 16, item 7): counts instead of a record per node, said in the trace.

``graphwatch.backwards.DRAW_SAVED_BOUND`` is lowered so a small real loop stands for a 1M-node chain: what is
checked is what is recorded (counts), never how long it took.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

import graphwatch
from graphwatch import backwards
from graphwatch.rendering.terminal import make_console, print_summary

BOUND = 50


def chain(w: torch.Tensor, length: int) -> torch.Tensor:
    """``h = tanh(h @ w)`` ``length`` times (2 nodes and about 3 saved tensors each), summed."""
    h = torch.ones(1, 4)
    for _ in range(length):
        h = torch.tanh(h @ w)
    return h.sum()


def bare_grad(length: int) -> torch.Tensor:
    w = torch.full((4, 4), 0.1, requires_grad=True)
    chain(w, length).backward()
    assert w.grad is not None
    return w.grad


@pytest.fixture
def small_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backwards, "DRAW_SAVED_BOUND", BOUND)


@pytest.mark.usefixtures("small_bound")
def test_a_first_backward_over_the_bound_keeps_no_node_records_and_says_so(tmp_path: Path) -> None:
    w = torch.full((4, 4), 0.1, requires_grad=True)
    with graphwatch.watch(summary=False) as gw:
        loss = chain(w, 40)
        loss.backward()
    assert w.grad is not None and torch.equal(w.grad, bare_grad(40))
    trace = gw.trace
    assert trace.backwards[0].nodes_reached == 2 * 40 + 1
    assert len(trace.nodes) <= 2 and not trace.saved  # the root and its input, not one per node
    [snapshot] = trace.snapshots
    assert snapshot.reason == "first backward" and "not drawn" in snapshot.dot
    assert f"saved {trace.steps[0].saved_packed} tensors" in snapshot.dot and trace.steps[0].saved_packed > BOUND
    loaded = graphwatch.load(gw.save(tmp_path / "trace.json"))
    assert loaded.snapshots == trace.snapshots
    assert "not drawn" in gw.report(tmp_path / "report").read_text()
    out = io.StringIO()
    print_summary(loaded, make_console(out))
    assert "step" in out.getvalue()


@pytest.mark.usefixtures("small_bound")
def test_a_first_backward_under_the_bound_is_drawn_whole() -> None:
    w = torch.full((4, 4), 0.1, requires_grad=True)
    with graphwatch.watch(summary=False) as gw:
        chain(w, 10).backward()
    [snapshot] = gw.trace.snapshots
    assert snapshot.reason == "first backward" and "not drawn" not in snapshot.dot
    assert len(gw.trace.nodes) == 2 * 10 + 1


@pytest.mark.usefixtures("small_bound")
def test_kept_graphs_are_found_past_the_bound() -> None:
    w = torch.full((4, 4), 0.1, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.01)
    with graphwatch.watch(summary=False) as gw:
        total = torch.zeros(())
        for _ in range(6):
            loss = chain(w, 40)
            loss.backward(retain_graph=True)
            opt.step()
            opt.zero_grad()
            total = total + loss
    assert "not drawn" in gw.trace.snapshots[0].dot
    assert any(f.kind == "graph-kept-alive" for f in gw.findings), [f.kind for f in gw.findings]
