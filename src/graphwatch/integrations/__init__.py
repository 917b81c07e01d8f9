"""graphwatch inside training frameworks and notebooks.

Each integration is imported only when used, and needs its framework installed
(``pip install 'torch-graphwatch[lightning]'``, ``[transformers]``, ``[notebook]``):

* :mod:`graphwatch.integrations.lightning`: ``GraphwatchCallback`` for a PyTorch Lightning ``Trainer``;
* :mod:`graphwatch.integrations.transformers`: ``GraphwatchCallback`` for a Hugging Face ``Trainer``;
* :mod:`graphwatch.integrations.notebook`: the ``%%graphwatch`` cell magic (``%load_ext graphwatch``).

A framework's step is graphwatch's step: the callbacks end one at each of the
framework's own step boundaries (``Session.end_step``).  A callback that finds a
session already watching (``graphwatch run``, ``%graphwatch start``, a
``with graphwatch.watch()`` block around ``fit()``) marks that session's steps
and leaves the session to whoever started it.

Example::

    >>> from graphwatch.integrations import Watched
    >>> with Watched(strict=False, level="default", out=None, summary=False) as watched:
    ...     watched.end_step()
    >>> len(watched.session.trace.steps), watched.session.active
    (1, False)
"""

from __future__ import annotations

import atexit
import sys
from pathlib import Path
from types import TracebackType

from ..errors import GraphLeakError
from ..session import Session, active_session, watch

__all__ = ["Watched", "WatchingCallback"]

_unfinished: Watched | None = None  # a framework run's own session, until the run ends


class Watched:
    """A session for one framework run: entered at the run's start, left at its end (or at its error).

    ``owned`` is False when another session was already watching: that session is used (its steps
    become the framework's) and is left to its owner.  A run that died without telling its callback
    (the Hugging Face ``Trainer`` has no exception event) leaves its session active; the next
    integration session closes it with the error that ended that run, and so does the process's exit.
    """

    def __init__(
        self, strict: bool, level: str, out: str | Path | None, summary: bool = True, explicit_steps: bool = True
    ) -> None:
        self.strict, self.level, self.out, self.summary = strict, level, out, summary
        self.explicit_steps = explicit_steps
        self.session: Session | None = None
        self.owned = False
        self._last_error_at_start: object = None

    def start(self) -> Watched:
        """Enter a new session, or use the one already watching; returns ``self``."""
        global _unfinished
        close_unfinished()
        current = active_session()
        if current is not None:
            self.session, self.owned = current, False
        else:
            self.session = watch(strict=self.strict, level=self.level, out=self.out, summary=self.summary)
            self.session.__enter__()
            self.owned = True
            self._last_error_at_start = getattr(sys, "last_value", None)
            if self.explicit_steps:
                _unfinished = self
        if self.explicit_steps:
            self.session.follow_explicit_steps()
        return self

    def stop(self, error: BaseException | None = None) -> None:
        """Leave the session (if this run owns it), recording ``error`` as what ended the run."""
        global _unfinished
        if _unfinished is self:
            _unfinished = None
        session = self.session
        if self.owned and session is not None and session.active:
            kind = type(error) if error is not None else None
            session.__exit__(kind, error, error.__traceback__ if error is not None else None)

    def __enter__(self) -> Watched:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.stop(error)

    def end_step(self) -> None:
        """End the current step (a framework's step boundary); a strict session's leak ends the run here."""
        __tracebackhide__ = True
        session = self.session
        if session is None or not session.active:
            return
        try:
            session.end_step()
        except GraphLeakError as leak:
            self.stop(leak)
            raise

    def error_since_start(self) -> BaseException:
        """The error that ended this run without its end event: the last one Python or IPython reported
        (``sys.last_value``) if it is newer than the run, else a stand-in saying so."""
        last = getattr(sys, "last_value", None)
        if isinstance(last, BaseException) and last is not self._last_error_at_start:
            return last
        return RuntimeError("the run ended without its end event (an error the framework did not report)")


class WatchingCallback:
    """What the framework callbacks share: their options (``strict``, ``out``, ``level``, as in
    :func:`graphwatch.watch`) and ``session``, the session of the current (or last) run (its ``findings``,
    ``trace``)."""

    def __init__(self, strict: bool = False, out: str | Path | None = None, level: str = "default") -> None:
        super().__init__()
        self.strict, self.out, self.level = strict, out, level
        self._watched: Watched | None = None

    @property
    def session(self) -> Session | None:
        """The session of the current (or last) run: its ``findings``, ``trace``."""
        return self._watched.session if self._watched is not None else None

    def _start(self, default_folder: Path, summary: bool) -> None:
        """Enter the run's session (or use the one already watching); the report goes to ``out``, or to
        ``default_folder``."""
        folder = self.out if self.out is not None else default_folder
        self._watched = Watched(self.strict, self.level, folder, summary=summary).start()

    def _end_step(self) -> None:
        if self._watched is not None:
            self._watched.end_step()

    def _stop(self, error: BaseException | None = None) -> None:
        if self._watched is not None:
            self._watched.stop(error)


def close_unfinished() -> None:
    """Close the session of a framework run that ended without its end event (see :class:`Watched`)."""
    unfinished = _unfinished
    if unfinished is not None:
        unfinished.stop(unfinished.error_since_start())


atexit.register(close_unfinished)
