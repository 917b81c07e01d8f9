"""Exceptions graphwatch raises.  Each message names the fix.

Example::

    >>> import graphwatch
    >>> issubclass(graphwatch.BackwardTwiceError, RuntimeError)
    True
"""

from __future__ import annotations

import itertools
import os
import sys
import warnings
from collections.abc import Collection
from types import TracebackType
from typing import Any

_PACKAGE = os.path.normcase(os.path.dirname(os.path.abspath(__file__))) + os.sep  # graphwatch's own files


class GraphwatchError(Exception):
    """Base class of graphwatch's own errors (bad input, misuse)."""


class UsageError(GraphwatchError, ValueError):
    """An option, argument or call order graphwatch cannot accept."""


class TraceFormatError(GraphwatchError, ValueError):
    """A file given to :func:`graphwatch.load` is not a trace graphwatch can read."""


class ExplainedError(RuntimeError):
    """One of torch's autograd errors, explained: torch's message first and unchanged, then graphwatch's.

    Raised in place of torch's RuntimeError inside a session (so ``except RuntimeError`` still catches it);
    ``finding`` holds the diagnosis.
    """

    def __init__(self, message: str, finding: object | None = None) -> None:
        super().__init__(message)
        self.finding = finding


class BackwardTwiceError(ExplainedError):
    """torch's "backward through the graph a second time" error, explained."""


class LossWithoutGraphError(ExplainedError):
    """torch's "element 0 of tensors does not require grad and does not have a grad_fn" error, explained
    (which ``torch.no_grad()`` block or decorator made the loss without a graph)."""


class GraphLeakError(GraphwatchError, AssertionError):
    """Raised by a strict session at the end of the first step that leaks a graph."""

    def __init__(self, message: str, findings: list[Any] | None = None) -> None:
        super().__init__(message)
        self.findings = list(findings or [])


def without_own_frames(
    tb: TracebackType | None, hidden: Collection[str] = (), folders: Collection[str] = ()
) -> TracebackType | None:
    """``tb`` with graphwatch's own frames (and those of the files ``hidden`` and of the files under
    ``folders``) unlinked: what is left is the user's frames and torch's, ending where the user's call into
    torch raised, as without graphwatch (with torch's folder in ``folders``: at the user's own call).

    The traceback entries are relinked in place; the first one kept is returned.

    >>> import sys
    >>> from graphwatch.capture.hooks.backward import parse_engine_args
    >>> try:
    ...     parse_engine_args(None, (), {})  # raises inside graphwatch's own code
    ... except TypeError:
    ...     tb = without_own_frames(sys.exc_info()[2])
    >>> tb.tb_next is None, tb.tb_frame.f_code.co_filename.startswith("<doctest")  # only the caller's frame
    (True, True)
    """
    kept = []
    while tb is not None:
        name = os.path.normcase(tb.tb_frame.f_code.co_filename)
        if name not in hidden and not name.startswith((_PACKAGE, *folders)):
            kept.append(tb)
        tb = tb.tb_next
    for outer, inner in itertools.pairwise(kept):
        outer.tb_next = inner
    if kept:
        kept[-1].tb_next = None
    return kept[0] if kept else None


def notify(message: str, category: type[Warning] = UserWarning, stacklevel: int = 2) -> None:
    """Warn with ``message``; where warnings are turned into errors (``python -W error``), print it on stderr
    instead.  What graphwatch has to say about itself (a picture it could not draw, a report it could not
    write) never ends the user's run, and never takes the place of the user's own exception.

    >>> import warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("error")
    ...     notify("graphwatch: could not draw the step 3 graph")  # printed on stderr, not raised
    """
    try:
        warnings.warn(message, category, stacklevel=stacklevel + 1)
    except Warning:
        try:
            print(message, file=sys.stderr)
        except (OSError, ValueError):  # stderr closed or gone: there is no one to tell
            pass
