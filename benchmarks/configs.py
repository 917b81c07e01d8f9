"""The configurations the benchmark compares: what watches a training loop, if anything.

Each entry maps a name to a description (listed in RESULTS.md) and a factory
returning a fresh context manager; one context spans a whole round of steps,
as in real use.  ``bare`` is the baseline every ratio is taken against.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

import graphwatch
from graphwatch.capture.graph.stack_limit import claim_stack
from graphwatch.capture.hooks.backward import EnginePatch, parse_engine_args
from graphwatch.capture.hooks.optimizer import OptimizerHooks
from graphwatch.capture.recorder import RSS_EVERY as _RSS_EVERY
from graphwatch.capture.steps.loop_steps import LoopSteps
from graphwatch.capture.steps.resident import ResidentMemory

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


class _LightFloor:
    """The least the light level must do to keep what it keeps, as plain tuples in lists: per backward its
    loop position (graphwatch's own :meth:`LoopSteps.positions`, the key of its line and of whether it ends
    the step), wall-clock time and the loss's weak reference (what an error is explained from); per step its
    wall-clock time, the autograd nodes made and the resident memory (graphwatch's own :class:`ResidentMemory`)
    every :data:`_RSS_EVERY` steps (no CPU time: graphwatch reads that system call on steps seen in full detail
    only, and the light level sees none so).  No records, no analysis, no step-end decision
    beyond a dictionary lookup, or, in a loop with no optimizer, a backward that follows one with no
    ``optimizer.step()`` between them ending the step before it (a step per backward)."""

    def __init__(self) -> None:
        self._thread = threading.get_ident()
        self._loop = LoopSteps()
        self._known: dict[tuple[int, ...], bool] = {}  # loop positions -> whether the event ends the step
        self._losses: dict[int, list[weakref.ref]] = {}
        self._at: tuple[int, ...] = ()
        self._open = False  # a backward ran since the last step end
        self.backwards: list[tuple[Any, ...]] = []
        self.steps: list[tuple[Any, ...]] = []
        self._resident = ResidentMemory()
        self._rss = 0
        self._clock = (time.perf_counter(), _next_sequence_nr())

    def engine(self, run: Callable[..., Any], outputs: Any, args: tuple, kwargs: dict) -> Any:
        if threading.get_ident() != self._thread:
            return run(outputs, *args, **kwargs)
        _, retain_graph, create_graph, _ = parse_engine_args(outputs, args, kwargs)
        at = self._loop.positions(sys._getframe(1))
        if self._open:  # no optimizer step since the last backward: it ended its step
            self._end_step()
        number = len(self.backwards)
        self._losses[number] = [weakref.ref(t) for t in outputs if isinstance(t, torch.Tensor)]
        self._losses.pop(number - 64, None)  # (the last 64, as a session remembers them)
        wall = time.perf_counter()
        try:
            return run(outputs, *args, **kwargs)
        finally:
            done = time.perf_counter() - wall
            self.backwards.append((number, len(self.steps), at, retain_graph, create_graph, done))
            self._known.setdefault(at, False)
            self._open = True

    def before_step(self, *_: Any) -> None:
        self._at = self._loop.positions(sys._getframe(2))

    def after_step(self, *_: Any) -> None:
        if self._known.setdefault(self._at, True):
            self._end_step()

    def _end_step(self) -> None:
        now = (time.perf_counter(), _next_sequence_nr())
        if not len(self.steps) % _RSS_EVERY:
            self._rss = self._resident.bytes()
        self.steps.append((*(a - b for a, b in zip(now, self._clock)), self._rss, len(self.backwards)))
        self._clock = now
        self._open = False

    def close(self) -> None:
        self._resident.close()


@contextlib.contextmanager
def _light_floor() -> Iterator[None]:
    floor = _LightFloor()
    patch = EnginePatch(floor.engine).install()
    hooks = OptimizerHooks(floor.before_step, floor.after_step)
    try:
        yield
    finally:
        hooks.remove()
        patch.remove()
        floor.close()


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
    "light_floor": (
        "the Python floor of the light level: an engine wrapper and optimizer hooks that keep what the light "
        "level keeps (each backward's loop position, wall-clock time and loss, each step's wall-clock time, nodes made and resident "
        "memory) as tuples in lists, with no records and no analysis (no graphwatch session)",
        _light_floor,
    ),
    "anomaly": ("torch.autograd.detect_anomaly()", torch.autograd.detect_anomaly),
    "profiler": ("torch.profiler.profile(activities=[CPU], profile_memory=True)", _profiler),
}
GW_CONFIGS = ("gw", "gw_full", "gw_nosnap", "light")  # the graphwatch sessions, whose own work is timed


def context(config: str) -> Any:
    """A fresh context manager for ``config``."""
    return CONFIGS[config][1]()
