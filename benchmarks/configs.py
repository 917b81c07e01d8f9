"""The configurations the benchmark compares: what watches a training loop, if anything.

Each entry maps a name to a description (listed in RESULTS.md) and a factory
returning a fresh context manager; one context spans a whole round of steps,
as in real use.  ``bare`` is the baseline every ratio is taken against.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

import graphwatch


def _profiler() -> Any:
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)


CONFIGS: dict[str, tuple[str, Callable[[], Any]]] = {
    "bare": ("no instrumentation", contextlib.nullcontext),
    "gw": (
        "graphwatch.watch(summary=False)  (defaults: level='default', snapshots='auto')",
        lambda: graphwatch.watch(summary=False),
    ),
    "gw_nosnap": (
        "graphwatch.watch(summary=False, snapshots='off')",
        lambda: graphwatch.watch(summary=False, snapshots="off"),
    ),
    "light": (
        "graphwatch.watch(summary=False, level='light')  (the lightest configuration)",
        lambda: graphwatch.watch(summary=False, level="light"),
    ),
    "anomaly": ("torch.autograd.detect_anomaly()", torch.autograd.detect_anomaly),
    "profiler": ("torch.profiler.profile(activities=[CPU], profile_memory=True)", _profiler),
}
GW_CONFIGS = ("gw", "gw_nosnap", "light")  # the graphwatch sessions, whose own work is timed


def context(config: str) -> Any:
    """A fresh context manager for ``config``."""
    return CONFIGS[config][1]()
