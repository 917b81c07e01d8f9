"""Exceptions graphwatch raises.  Each message names the fix.

Example::

    >>> import graphwatch
    >>> issubclass(graphwatch.BackwardTwiceError, RuntimeError)
    True
"""

from __future__ import annotations

from typing import Any


class GraphwatchError(Exception):
    """Base class of graphwatch's own errors (bad input, misuse)."""


class UsageError(GraphwatchError, ValueError):
    """An option, argument or call order graphwatch cannot accept."""


class TraceFormatError(GraphwatchError, ValueError):
    """A file given to :func:`graphwatch.load` is not a trace graphwatch can read."""


class BackwardTwiceError(RuntimeError):
    """torch's "backward through the graph a second time" error, explained.

    Raised in place of torch's RuntimeError inside a session (so
    ``except RuntimeError`` still catches it); ``finding`` holds the diagnosis.
    """

    def __init__(self, message: str, finding: object | None = None) -> None:
        super().__init__(message)
        self.finding = finding


class GraphLeakError(GraphwatchError, AssertionError):
    """Raised by a strict session at the end of the first step that leaks a graph."""

    def __init__(self, message: str, findings: list[Any] | None = None) -> None:
        super().__init__(message)
        self.findings = list(findings or [])
