"""``@graphwatch.step``: each call of the decorated function is one step.

With a session active, each call runs inside ``session.step()``.  With none,
the first call starts a process-wide session that prints its summary (and
writes its report, given ``out``) when the interpreter exits.  Its options are
those of ``graphwatch.watch()``, set beforehand with :func:`configure`; the
``GRAPHWATCH_OUT`` environment variable gives ``out`` when ``configure`` does not
(empty, like ``out=""``: no report).  The report folder is resolved when that
session starts.  One that cannot be written is said once, then, in a warning
that names the setting (``GRAPHWATCH_OUT`` or ``configure(out=)``); the
training goes on, and at its end a second line says that no report was written.

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

from .errors import UsageError, notify
from .options import OUT_VARIABLE, SessionOptions, check_out_type, report_folder
from .session import Session, active_session

F = TypeVar("F", bound=Callable[..., Any])
_process_session: Session | None = None
_no_report = False  # the process-wide session was asked for a report folder it cannot write
_configured: dict[str, Any] = {}


def configure(**options: Any) -> None:
    """Set options of the session that ``@graphwatch.step`` starts when no session is active: those of
    :func:`graphwatch.watch` (``out="report"``, ``strict=True``, ``level="light"``, ...), each call adding to
    the last.  Call it before the first decorated call; a wrong option is a :class:`~graphwatch.UsageError`.
    ``out=""`` means no report (and overrides ``GRAPHWATCH_OUT``).

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
    SessionOptions.checked(**{**_configured, **options, "out": None})
    check_out_type(options.get("out"), "configure")  # (a folder that cannot be written: said when the session starts)
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
    if _no_report:
        notify("graphwatch: no report was written: its folder cannot be written (see the warning when the session "
               "started)")


def _step_session_options() -> dict[str, Any]:
    """The options of the session the first decorated call starts, its report folder resolved now; a folder
    that cannot be written is said in a warning (naming the setting that gave it) and leaves no report."""
    global _no_report
    options = dict(_configured)
    given, setting = (options["out"], "configure") if "out" in options else (os.environ.get(OUT_VARIABLE), OUT_VARIABLE)
    try:
        options["out"] = report_folder(given, setting)
    except UsageError as error:
        _no_report = True
        notify(f"graphwatch: {error}; the training goes on, with no report", stacklevel=4)
        options["out"] = None
    return options


def _session_for_step() -> Session:
    global _process_session
    session = active_session()
    if session is None:
        session = _process_session = Session(**_step_session_options()).__enter__()
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
