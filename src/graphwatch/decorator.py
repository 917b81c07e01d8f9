"""``@graphwatch.step``: each call of the decorated function is one step.

With a session active, each call runs inside ``session.step()``.  With none,
the first call starts a process-wide session that prints its summary (and
writes its report, given ``out``) when the interpreter exits.  Its options are
those of ``graphwatch.watch()``, set beforehand with :func:`configure`; the
``GRAPHWATCH_OUT`` environment variable gives ``out`` when ``configure`` does not.

Example::

    >>> import torch, graphwatch
    >>> w = torch.ones(3, requires_grad=True)
    >>> @graphwatch.step
    ... def train_step(x):
    ...     (w * x).sum().backward()
    >>> with graphwatch.watch(summary=False) as gw:
    ...     for _ in range(2):
    ...         train_step(torch.ones(3))
    >>> [s.source for s in gw.trace.steps]
    ['explicit', 'explicit']
"""

from __future__ import annotations

import atexit
import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar

from .errors import UsageError
from .options import SessionOptions
from .session import Session, active_session

F = TypeVar("F", bound=Callable[..., Any])
OUT_VARIABLE = "GRAPHWATCH_OUT"  # the report folder of the session @graphwatch.step starts, unless configured
_process_session: Session | None = None
_configured: dict[str, Any] = {}


def configure(**options: Any) -> None:
    """Set options of the session that ``@graphwatch.step`` starts when no session is active: those of
    :func:`graphwatch.watch` (``out="report"``, ``strict=True``, ``level="light"``, ...), each call adding to
    the last.  Call it before the first decorated call; a wrong option is a :class:`~graphwatch.UsageError`.

    Example::

        >>> import graphwatch
        >>> graphwatch.configure(summary=False)
        >>> try:
        ...     graphwatch.configure(levle="light")
        ... except graphwatch.UsageError as error:
        ...     print(str(error).split(";")[0])
        graphwatch.watch() got an unknown option 'levle'
        >>> graphwatch.decorator._configured.clear()  # (back to the defaults)
    """
    SessionOptions.checked(**{**_configured, **options})  # (also: a report folder that cannot be written)
    if _process_session is not None:
        raise UsageError(
            "graphwatch.configure() after the first @graphwatch.step call: that call started the session with "
            "the options it had; call configure() before it"
        )
    _configured.update(options)


def _end_process_session() -> None:
    session = _process_session
    if session is not None and session.active:
        session.__exit__(None, None, None)


def _session_for_step() -> Session:
    global _process_session
    session = active_session()
    if session is None:
        options = {"out": os.environ.get(OUT_VARIABLE) or None, **_configured}
        session = _process_session = Session(**options).__enter__()
        atexit.register(_end_process_session)
    return session


def step(fn: F) -> F:
    """Decorate a training-step function: each call is one graphwatch step."""
    if not callable(fn):
        raise UsageError(
            f"@graphwatch.step decorates a function; got {type(fn).__name__}. "
            "Write `@graphwatch.step` above `def train_step(...)`"
        )

    @functools.wraps(fn)
    def run_step(*args: Any, **kwargs: Any) -> Any:
        with _session_for_step().step():
            return fn(*args, **kwargs)

    return run_step  # type: ignore[return-value]
