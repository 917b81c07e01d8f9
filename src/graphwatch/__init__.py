"""graphwatch: watch the lifecycle of PyTorch autograd graphs while a training loop runs.

Example::

    >>> import torch, graphwatch
    >>> with graphwatch.watch(summary=False) as gw:
    ...     x = torch.ones(2, requires_grad=True)
    ...     (x * x).sum().backward()
    >>> gw.trace.backwards[0].nodes_reached
    2
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .analysis import FINDING_KINDS
from .decorator import configure, step
from .errors import (
    BackwardTwiceError,
    ExplainedError,
    GraphLeakError,
    GraphwatchError,
    LossWithoutGraphError,
    TraceFormatError,
    UsageError,
)
from .model import Finding, Trace, load_trace
from .session import Session, active_session, watch
from .version import __version__ as __version__

if TYPE_CHECKING:
    from .rendering.dot import make_dot

# Names whose modules load on first use (``graphwatch.make_dot``), not at ``import graphwatch``: a short script
# and every pytest run (the plugin imports graphwatch) would pay for them (tests/test_import_cost.py).
_LAZY_NAMES = {"make_dot": ".rendering.dot"}

if "IPython" in sys.modules:  # a notebook or an IPython prompt: findings show as the report shows them
    from .rendering.notebook import register_displays

    register_displays()


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext graphwatch`` in Jupyter: the ``%%graphwatch`` magic (:mod:`graphwatch.integrations.notebook`)."""
    from .integrations.notebook import load_ipython_extension as load_extension

    load_extension(ipython)


def __getattr__(name: str) -> Any:
    """``graphwatch.make_dot`` and the like: import the module that defines the name, now that it is used."""
    if name not in _LAZY_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY_NAMES[name], __name__), name)
    globals()[name] = value  # the next use is an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY_NAMES])


def load(path: str | Path) -> Trace:
    """Read a JSON trace written by ``gw.save(path)`` (or a report's trace.json)."""
    return load_trace(path)


__all__ = [
    "FINDING_KINDS",
    "BackwardTwiceError",
    "ExplainedError",
    "Finding",
    "GraphLeakError",
    "GraphwatchError",
    "LossWithoutGraphError",
    "Session",
    "Trace",
    "TraceFormatError",
    "UsageError",
    "active_session",
    "configure",
    "load",
    "load_ipython_extension",
    "make_dot",
    "step",
    "watch",
]
