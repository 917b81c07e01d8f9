"""The configurations the benchmark compares: what watches a training loop, if anything.

Each entry maps a name to a description (listed in RESULTS.md) and a factory
returning a fresh context manager; one context spans a whole round of steps,
as in real use.  ``bare`` is the baseline every ratio is taken against.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

import graphwatch
from graphwatch.capture.stack_limit import claim_stack

_next_sequence_nr = torch._C._autograd._get_sequence_nr


class _FloorHandle:
    """The least a saved-tensor hook must keep to know when autograd lets go of a tensor: the tensor torch would
    keep, and a finalizer."""

    __slots__ = ("tensor",)
    alive = 0  # the finalizer's bookkeeping: its cost is what is measured, nothing reads it

    def __del__(self) -> None:
        _FloorHandle.alive -= 1


def _floor_pack(tensor: torch.Tensor) -> _FloorHandle:
    handle = _FloorHandle()
    _FloorHandle.alive += 1
    # as torch (and graphwatch): an input kept itself, an output of the op saving it as a detached alias
    output = not tensor.is_leaf and tensor.grad_fn._sequence_nr() == _next_sequence_nr() - 1  # type: ignore[union-attr]
    handle.tensor = tensor.detach() if output else tensor
    return handle


def _floor_unpack(handle: _FloorHandle) -> torch.Tensor:
    return handle.tensor


@contextlib.contextmanager
def _floor() -> Iterator[None]:
    # reading grad_fn makes Python wrappers for nodes, so freeing a deep chain needs graphwatch's stack room too
    _, give_back = claim_stack("default")
    try:
        with torch.autograd.graph.saved_tensors_hooks(_floor_pack, _floor_unpack):
            yield
    finally:
        give_back()


def _profiler() -> Any:
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)


CONFIGS: dict[str, tuple[str, Callable[[], Any]]] = {
    "bare": ("no instrumentation", contextlib.nullcontext),
    "gw": (
        "graphwatch.watch(summary=False)  (defaults: level='default', snapshots='auto')",
        lambda: graphwatch.watch(summary=False),
    ),
    "gw_full": (
        "graphwatch.watch(summary=False, level='full')  (every step in full detail: the default level before issue 25)",
        lambda: graphwatch.watch(summary=False, level="full"),
    ),
    "gw_nosnap": (
        "graphwatch.watch(summary=False, snapshots='off')",
        lambda: graphwatch.watch(summary=False, snapshots="off"),
    ),
    "light": (
        "graphwatch.watch(summary=False, level='light')  (the lightest configuration)",
        lambda: graphwatch.watch(summary=False, level="light"),
    ),
    "floor": (
        "the Python floor of the default level: a pack hook whose handle keeps what torch keeps and counts "
        "itself in __del__ (no graphwatch; the least any Python tool that knows each saved tensor's lifetime does)",
        _floor,
    ),
    "anomaly": ("torch.autograd.detect_anomaly()", torch.autograd.detect_anomaly),
    "profiler": ("torch.profiler.profile(activities=[CPU], profile_memory=True)", _profiler),
}
GW_CONFIGS = ("gw", "gw_full", "gw_nosnap", "light")  # the graphwatch sessions, whose own work is timed


def context(config: str) -> Any:
    """A fresh context manager for ``config``."""
    return CONFIGS[config][1]()
