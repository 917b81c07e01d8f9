"""Values of the user's that raise on every touch leave the loop as it is without graphwatch.

graphwatch reads what the user's frames hold at step ends (the holder census), at optimizer steps (parameter
names) and when a backward fails (what carried the graph).  A value whose every method raises (``__repr__``,
``__len__``, ``__iter__``, ``__getattr__``, a ``__dict__`` or ``__class__`` property: a lazy proxy whose target
is gone), a dict or list subclass whose ``items()``, ``__len__`` or ``__getitem__`` raises, and a module whose
``__getattr__`` raises for any name it does not know are read by their base types' own methods or passed over:
the losses are the same bit for bit, no warning is given, and what a plain list keeps is still found.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn

import graphwatch


class Hostile(Exception):
    """What every hostile method raises."""


def _raise(*args: Any, **kwargs: Any) -> Any:
    raise Hostile("touched")


class Untouchable:
    """Every dunder graphwatch might call raises."""

    __repr__ = __str__ = __len__ = __iter__ = __bool__ = __eq__ = __getitem__ = _raise
    __hash__ = object.__hash__

    def __getattr__(self, name: str) -> Any:
        raise Hostile(name)

    @property
    def __dict__(self) -> dict:  # type: ignore[override]
        raise Hostile("__dict__")

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # type: ignore[override]
        raise Hostile("__class__")


class RaisingDict(dict):
    items = values = keys = __iter__ = __len__ = _raise  # type: ignore[assignment]


class RaisingList(list):
    __getitem__ = __len__ = __iter__ = _raise  # type: ignore[assignment]


class StrictModule(nn.Module):
    """A module whose ``__getattr__`` raises for any name but its layer's."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 1)

    def __getattr__(self, name: str) -> Any:
        if name in ("lin", "_parameters", "_buffers", "_modules"):
            return super().__getattr__(name)
        raise Hostile(name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


GLOBAL_UNTOUCHABLE, GLOBAL_DICT, GLOBAL_LIST = Untouchable(), RaisingDict(b=1), RaisingList([1])


def _train(kept: list[torch.Tensor] | None, carry: bool = False) -> list[float]:
    """20 SGD steps of a :class:`StrictModule` with hostile values in the frame (a graph inside the raising
    containers too); each step's loss appended to ``kept``; with ``carry``, a state carried into the next step
    without ``.detach()`` (the second backward raises)."""
    torch.manual_seed(0)
    model = StrictModule()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    untouchable = Untouchable()
    raising_dict = RaisingDict(a=torch.ones(1, requires_grad=True) * 2)
    raising_list = RaisingList([torch.ones(1, requires_grad=True) * 3])
    keyed = {Untouchable(): [untouchable], "lists": [raising_list, raising_dict]}
    x, y = torch.linspace(-1, 1, 32).reshape(8, 4), torch.linspace(0, 1, 8).reshape(8, 1)
    state = torch.zeros(8, 1)
    losses = []
    for _ in range(20):
        state = model(x) + state if carry else model(x)
        loss = nn.functional.mse_loss(state, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if kept is not None:
            kept.append(loss)
        losses.append(loss.item())
    del keyed
    return losses


@pytest.mark.parametrize("level", ["default", "full", "light"])
def test_hostile_values_in_the_frames_change_no_loss_and_hide_no_kept_graph(level: str, one_thread: None) -> None:
    bare = _train([])
    kept: list[torch.Tensor] = []
    with warnings.catch_warnings(record=True) as caught, graphwatch.watch(summary=False, level=level) as gw:
        warnings.simplefilter("always")
        watched = _train(kept)
    assert watched == bare
    assert [str(w.message) for w in caught] == []
    found = {f.kind for f in gw.findings}
    assert ("graph-kept-alive" in found) == (level != "light")


@pytest.mark.parametrize("level", ["default", "full", "light"])
def test_a_backward_twice_among_hostile_values_raises_torchs_error_explained(level: str, one_thread: None) -> None:
    with pytest.raises(RuntimeError) as bare:
        _train(None, carry=True)
    with warnings.catch_warnings(record=True) as caught, pytest.raises(graphwatch.BackwardTwiceError) as watched:
        warnings.simplefilter("always")
        with graphwatch.watch(summary=False, level=level):
            _train(None, carry=True)
    assert str(watched.value).startswith(str(bare.value))
    assert [str(w.message) for w in caught] == []
    if level != "light":  # (the light level names no carrier: nothing was recorded of the step that made it)
        assert "carried into step 1 by `state`" in str(watched.value)
