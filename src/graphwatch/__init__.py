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

import sys
from pathlib import Path

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
from .rendering.dot import make_dot
from .session import Session, active_session, watch

__version__ = "0.1.0"

if "IPython" in sys.modules:  # a notebook or an IPython prompt: findings show as the report shows them
    from .rendering.notebook import register_displays

    register_displays()


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext graphwatch`` in Jupyter: the ``%%graphwatch`` magic (:mod:`graphwatch.integrations.notebook`)."""
    from .integrations.notebook import load_ipython_extension as load_extension

    load_extension(ipython)


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
