"""How much of a run graphwatch itself took, measured without adding work to any forward op.

graphwatch's code runs in two kinds of places.  Once per backward, per step
end and per optimizer step (the wrapper around the autograd engine with its
graph walks, the step ends with their holder search, findings and drawings,
the optimizer hooks): there :class:`OwnTime` reads the wall clock
(``time.perf_counter``, about 0.1 µs a read: the CPU-time clocks cost ten times
that on some machines) on the way in and out.  And inside every forward op
that saves a tensor (the saved-tensor hooks): timing each call would cost
about what the hook itself costs, so the session multiplies the tensors it saw
saved by a per-tensor cost that :func:`saved_hook_cost` measures once per
process (a few milliseconds: the same small op run with and without
graphwatch's hooks, best of three).  That part is an estimate, and is named so.
A loaded machine stretches graphwatch's wall-clock time as much as the run's,
so its share of the run's wall clock stays fair.

Example::

    >>> import time
    >>> own = OwnTime()
    >>> started = time.perf_counter()
    >>> _ = sum(range(100_000))
    >>> own.add("step ends", started)
    >>> own.parts["step ends"] > 0, sorted(own.parts)
    (True, ['around backwards', 'optimizer hooks', 'step ends'])
    >>> 0 < saved_hook_cost() < 0.01  # seconds per saved tensor
    True
"""

from __future__ import annotations

import functools
import threading
import time

import torch

from ...model import Trace
from ...model.columns import field_values
from ...model.records import OWN_ESTIMATED


class OwnTime:
    """graphwatch's own time in a session (wall clock, in its thread), in seconds by part (``around
    backwards``, ``step ends``, ``optimizer hooks``), and the session's clocks from :meth:`start` on."""

    __slots__ = ("_cpu", "_wall", "parts")

    def __init__(self) -> None:
        self.parts = {"around backwards": 0.0, "step ends": 0.0, "optimizer hooks": 0.0}
        self.start()

    def start(self) -> None:
        """The session starts now (its wall clock and its process's CPU time count from here)."""
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def add(self, part: str, since: float) -> None:
        """Add the time from ``since`` (a ``time.perf_counter()``) to now to ``part``."""
        self.parts[part] += time.perf_counter() - since

    def record(self, trace: Trace, saved_hooks: bool) -> None:
        """Write the session's wall clock and process CPU time so far, and graphwatch's own share, into
        ``trace``; with ``saved_hooks`` (not the light level) the hooks' share too, estimated from the saved
        tensors the trace counted."""
        trace.seconds = time.perf_counter() - self._wall
        trace.cpu_seconds = time.process_time() - self._cpu
        trace.own_seconds = dict(self.parts)
        if saved_hooks:
            saved = sum(field_values(trace.steps, "saved_packed"))
            trace.own_seconds[OWN_ESTIMATED] = saved * saved_hook_cost() if saved else 0.0


@functools.cache
def saved_hook_cost(samples: int = 256) -> float:
    """Seconds graphwatch's saved-tensor hooks add to one saved tensor (its pack, its record, its free),
    measured once per process: ``samples`` small ops that save a tensor each, with the hooks of a scratch
    recorder and without, the fastest of three rounds each.  It runs in a thread of its own, where none of
    the caller's saved-tensor hooks, modes or grad mode apply (they are per thread): a user's own hooks
    never see these tensors."""
    found: list[float] = []
    thread = threading.Thread(target=lambda: found.append(_measure_saved_hooks(samples)), name="graphwatch-cost")
    thread.start()
    thread.join()
    return found[0] if found else 0.0


def _measure_saved_hooks(samples: int) -> float:
    from ..recorder import Recorder
    from .saved import make_hooks

    recorder = Recorder()
    pack, unpack = make_hooks(recorder)
    x = torch.ones(4, requires_grad=True, device="cpu")

    def saving() -> float:
        started = time.perf_counter()
        for _ in range(samples):
            y = x.exp()  # saves its result; freed at once
            del y
        return time.perf_counter() - started

    try:
        bare = min(saving() for _ in range(3))
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            hooked = min(saving() for _ in range(3))
    finally:
        recorder.close()
    return max(0.0, hooked - bare) / samples
