"""The holder search at step ends: what it keeps between searches is right, and a holder's steps are spans.

The loops run with every step in full detail (``level="full"``), so that every step end searches; the
default level searches at the ends of the steps it sees in full detail (``test_adaptive.py``)."""

from __future__ import annotations

import torch

import graphwatch
from graphwatch.model import StepSpans, load_trace


def _loop(steps: int) -> tuple[graphwatch.Session, list[list[int]]]:
    """A loop that keeps the loss of every third step (from step 1: step 0 holds set-up) in a list and
    drops the oldest one step later once it holds three; returns the session and, per iteration, the
    steps whose losses the list holds at its end."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses: list[torch.Tensor] = []
    kept: list[int] = []
    held: list[list[int]] = []
    with graphwatch.watch(summary=False, snapshots="off", keep_steps=100, level="full") as gw:
        for step in range(steps):
            opt.zero_grad()
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            opt.step()
            if step % 3 == 1:
                losses.append(loss)
                kept.append(step)
            elif step % 3 == 2 and len(losses) > 3:
                del losses[0], kept[0]  # a graph dies, none joins: no new search, the last answer is trimmed
            held.append(list(kept))
    return gw, held


def test_a_sum_that_keeps_every_step_holds_one_span_of_steps() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with graphwatch.watch(summary=False, snapshots="off", level="full") as gw:
        total_loss = torch.zeros(())
        for _ in range(60):
            opt.zero_grad()
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            opt.step()
            total_loss += loss
    ends = [s for s in gw.trace.steps if s.holders]
    assert len(ends) >= 15  # (older steps give their holders up with their detail)
    for record in ends:
        (holder,) = record.holders
        assert holder.name == "total_loss"
        steps = StepSpans.of(holder.steps)
        assert len(steps.spans) == 1 and steps.spans[0][1] == record.index, (record.index, steps.spans)


def test_a_holder_kept_between_searches_loses_the_steps_whose_graphs_died() -> None:
    gw, held = _loop(40)
    for record in gw.trace.steps[4:39]:
        assert record.holders, record.index
        named = sorted({s for h in record.holders for s in h.steps})
        # the step ends at opt.step(): the list then holds what the iteration before left in it
        assert named == held[record.index - 1], record.index


def test_holder_steps_round_trip_through_the_trace_as_a_list(tmp_path) -> None:
    gw, _ = _loop(12)
    path = tmp_path / "trace.json"
    gw.save(path)
    assert '"holders":[{"name":"losses[' in path.read_text()  # (written as plain JSON lists)
    loaded = load_trace(path)
    saved = [h.steps for s in gw.trace.steps for h in s.holders]
    assert saved and [h.steps for s in loaded.steps for h in s.holders] == saved
    assert all(isinstance(h.steps, StepSpans) for s in loaded.steps for h in s.holders)


class _Cache:
    """A class of the user's own: its attributes (or its instances') may hold a step's graph."""

    last: torch.Tensor | None = None


def test_library_modules_classes_and_functions_are_not_searched_but_the_users_are() -> None:
    """A module, class or function is judged by its own module's file (its type is a builtin, whose module
    has no file); before, every one a user frame named (torch, nn, F) had its attributes scanned."""
    import types

    from graphwatch.capture.causes.holders import _of_a_user_class

    user_module = types.ModuleType("user_settings")
    user_module.__file__ = __file__

    def user_function() -> None:
        pass

    for library in (torch, torch.nn, torch.nn.Linear, torch.nn.functional.relu, types):
        assert not _of_a_user_class(library), library
    for own in (user_module, _Cache, _Cache(), user_function):
        assert _of_a_user_class(own), own


def test_a_graph_kept_on_a_user_class_attribute_is_still_found() -> None:
    model = torch.nn.Linear(4, 1)
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        for _ in range(4):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            _Cache.last = loss if _Cache.last is None else _Cache.last + loss  # every step's graph, kept
            gw.end_step()
    _Cache.last = None
    assert any(f.kind == "graph-kept-alive" and "_Cache.last" in f.message for f in gw.findings), gw.findings
