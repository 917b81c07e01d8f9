"""``@graphwatch.step``: each call of the decorated function is one step.

With a session active, each call runs inside ``session.step()``.  With none,
the first call starts a process-wide session that prints its summary when
the interpreter exits.

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
from collections.abc import Callable
from typing import Any, TypeVar

from .errors import UsageError
from .session import Session, active_session

F = TypeVar("F", bound=Callable[..., Any])
_process_session: Session | None = None


def _end_process_session() -> None:
    session = _process_session
    if session is not None and session.active:
        session.__exit__(None, None, None)


def _session_for_step() -> Session:
    global _process_session
    session = active_session()
    if session is None:
        session = _process_session = Session().__enter__()
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
