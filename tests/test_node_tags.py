"""Node tags and quick-walk groups count exactly the nodes alive, and a graph carried from one session into the
next is walked as untagged (it once raised IndexError inside the user's backward)."""

from __future__ import annotations

import gc

import torch

import graphwatch
from graphwatch.capture.graph.graph_walk import quick_walk, walk
from graphwatch.capture.graph.node_tags import METADATA_KEY, NodeGroup, NodeTag
from graphwatch.capture.graph.stack_limit import TouchedNodes
from graphwatch.capture.recorder import Recorder


def _nodes_below(root: object) -> int:
    """Distinct autograd nodes reachable from ``root``, AccumulateGrad excluded."""
    seen: set[int] = set()
    keep = []  # the nodes visited, held so that their id()s are not reused during the walk
    stack = [root]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen or type(node).__name__ == "AccumulateGrad":
            continue
        seen.add(id(node))
        keep.append(node)
        stack.extend(child for child, _ in node.next_functions)  # type: ignore[attr-defined]
    return len(seen)


def test_a_quick_walk_counts_its_group_and_a_full_walk_splits_nodes_off_without_counting_twice() -> None:
    recorder = Recorder()
    gc.collect()  # earlier tests' tagged nodes that wait for the collector die now, not inside the test
    touched = TouchedNodes.alive
    x = torch.ones(3, requires_grad=True)
    loss = ((x * 2).exp() + 1).sum()
    result = quick_walk(recorder, [loss.grad_fn], backward_id=0)
    assert result is not None and result.nodes_reached == 4
    assert type(loss.grad_fn.metadata[METADATA_KEY]) is NodeGroup
    assert (recorder.live.nodes_total, TouchedNodes.alive - touched) == (4, 4)

    walk(recorder, [loss.grad_fn])  # every node gets a tag and a record of its own
    assert type(loss.grad_fn.metadata[METADATA_KEY]) is NodeTag
    assert loss.grad_fn.metadata[METADATA_KEY].backward == 0  # what the group knew, kept
    assert (recorder.live.nodes_total, TouchedNodes.alive - touched) == (4, 4)

    del loss
    gc.collect()
    assert (recorder.live.nodes_total, TouchedNodes.alive - touched) == (0, 0)


def test_nodes_that_outlive_the_rest_of_their_group_are_counted_exactly_at_the_step_end() -> None:
    recorder = Recorder()
    x = torch.ones(4, requires_grad=True)
    kept = (x * 3).tanh()  # a tensor the loop keeps (with its graph) after the loss is gone
    loss = (kept.exp() * 2).sum()
    assert quick_walk(recorder, [loss.grad_fn], backward_id=0) is not None
    assert recorder.live.nodes_total == _nodes_below(loss.grad_fn) == 5
    del loss
    assert recorder.live.nodes_total == 5  # the group lives on in the kept nodes: its count is not updated yet
    recorder.end_step("explicit")  # its dead nodes are counted off here
    assert recorder.trace.steps[0].live_nodes == _nodes_below(kept.grad_fn) == 2
    assert dict(recorder.trace.steps[0].nodes_alive_by_step) == {0: 2}
    del kept
    assert recorder.live.nodes_total == 0


def _carried_gru_run(sessions: int, watched: bool) -> list[torch.Tensor]:
    """Three steps per session of a GRU whose hidden state is never detached, backwarded several times a step
    with retain_graph=True (parameters updated through ``.data``); the state is carried across sessions, the
    first of which runs bare."""
    torch.manual_seed(0)
    gru, head = torch.nn.GRUCell(4, 8), torch.nn.Linear(8, 1)
    params = [*gru.parameters(), *head.parameters()]
    inputs = torch.randn(sessions * 3 * 3, 1, 4)
    hidden = torch.zeros(1, 8)
    grads = []
    for session in range(sessions):
        with graphwatch.watch(summary=False) if session and watched else torch.enable_grad():
            for step in range(3):
                for segment in range(3):
                    hidden = gru(inputs[(session * 3 + step) * 3 + segment], hidden)
                    for p in params:
                        p.grad = None
                    head(hidden).sum().backward(retain_graph=True)
                    grads.append(torch.cat([p.grad.flatten() for p in params]))
                with torch.no_grad():
                    for p in params:
                        p.data.add_(p.grad, alpha=-0.1)
    return grads


def test_a_graph_carried_from_one_session_into_the_next_keeps_training_as_bare() -> None:
    # the first session runs bare, then two watched sessions: the third meets nodes tagged by the second
    bare = _carried_gru_run(3, watched=False)
    watched = _carried_gru_run(3, watched=True)
    assert len(bare) == len(watched) == 27
    assert all(torch.equal(a, b) for a, b in zip(bare, watched))


def test_at_the_session_end_the_touched_nodes_still_alive_are_counted_exactly() -> None:
    # what the stack limit's give-back waits for (capture/graph/stack_limit.py): no node of a dead loss left counted
    gc.collect()
    touched = TouchedNodes.alive
    x = torch.ones(4, requires_grad=True)
    with graphwatch.watch(summary=False):
        losses = []
        for step in range(5):  # the first backward gets the full walk; the later ones are grouped
            made = (x * 3).tanh()
            loss = (made.exp() * 2).sum()
            loss.backward()
            if step == 1:
                kept, losses = made, [loss]
            if step == 4:
                losses.clear()  # step 1's loss dies three steps later: its group is an old one by now
        del made, loss
    assert TouchedNodes.alive - touched == _nodes_below(kept.grad_fn) == 2
    del kept
    assert TouchedNodes.alive == touched
