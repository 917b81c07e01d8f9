"""Signals that land inside graphwatch's hooks or finalizers still reach the user's code.

Python runs a signal handler at whatever line the main thread is on.  An
exception raised inside a ``__del__`` or a weakref finalizer is printed and
dropped, and graphwatch runs many (one per saved tensor): without care, a
Ctrl-C pressed during training would often be lost.  :class:`SignalGuard`
sends such a signal again a moment later, until it lands in user code.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any


class Terminated(BaseException):
    """Raised inside the running script when the process receives SIGTERM.

    A ``BaseException`` (like ``KeyboardInterrupt``), so that a script's
    ``except Exception:`` does not swallow it.
    """


class SignalGuard:
    """Stops the script on SIGTERM (raising :class:`Terminated`) and Ctrl-C (``KeyboardInterrupt``) while armed.

    Entered around the whole run (script, report, summary): while the script
    runs (``armed()``) SIGTERM stops it; afterwards a late SIGTERM only sets
    ``terminated``, so the report is still written.  The previous handlers are
    put back on exit.  Outside the main thread (where Python cannot handle
    signals) it does nothing.

    Python runs a signal handler at whatever line the main thread is on.  An
    exception raised inside a ``__del__`` or a weakref finalizer is printed and
    dropped (graphwatch runs many: one per saved tensor), and one raised inside
    graphwatch's own hooks would cut its bookkeeping short; so when a signal
    lands there, the guard sends it again a moment later, until it lands in the
    script's code.

    Example::

        >>> with SignalGuard() as guard:
        ...     with guard.armed():
        ...         pass
        >>> guard.terminated
        False
    """

    RETRY_SECONDS = 0.02

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
        self.signals = signals
        self.terminated = False  # SIGTERM arrived (at any time inside the guard)
        self._previous: dict[int, Any] = {}
        self._armed = False
        self._active = sys.platform != "win32" and threading.current_thread() is threading.main_thread()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGTERM:
            self.terminated = True
        if not self._armed:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            return
        if _interrupts_user_code(frame):
            self._armed = False  # one stop per run
            raise Terminated("received SIGTERM") if signum == signal.SIGTERM else KeyboardInterrupt()
        retry = threading.Timer(self.RETRY_SECONDS, os.kill, (os.getpid(), signum))
        retry.daemon = True
        retry.start()

    def __enter__(self) -> SignalGuard:
        if self._active:
            if signal.SIGTERM in self.signals:
                self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._handle)
            if signal.SIGINT in self.signals and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                # only Python's own Ctrl-C handler is replaced: not one the user installed, nor an outer guard
                self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        while self._previous:
            signum, handler = self._previous.popitem()
            signal.signal(signum, handler)

    def arm(self) -> None:
        """From now until exit, signals raise in the user's code (a session arms its Ctrl-C guard at once)."""
        self._armed = self._active

    @contextmanager
    def armed(self) -> Iterator[None]:
        """Inside this block SIGTERM raises :class:`Terminated` and Ctrl-C ``KeyboardInterrupt`` in the script."""
        self._armed = self._active
        try:
            yield
        finally:
            self._armed = False


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# graphwatch's files that run the script (the outermost frames), as opposed to hooks called from inside it
_OUTER_FILES = frozenset(os.path.join(_PACKAGE_DIR, name) for name in ("runner.py", "cli.py", "__main__.py", "demo.py", "signals.py"))
_WEAKREF_FILE = os.path.abspath(weakref.__file__)


def _interrupts_user_code(frame: FrameType | None) -> bool:
    """False when ``frame`` is inside a ``__del__``, a weakref finalizer or one of graphwatch's hooks."""
    while frame is not None:
        code = frame.f_code
        filename = os.path.abspath(code.co_filename)
        if code.co_name == "__del__" or filename == _WEAKREF_FILE:
            return False
        if filename.startswith(_PACKAGE_DIR) and filename not in _OUTER_FILES:
            return False
        frame = frame.f_back
    return True


