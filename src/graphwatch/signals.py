"""Signals that land inside graphwatch's hooks or finalizers still reach the user's code.

Python runs a signal handler at whatever line the main thread is on.  An
exception raised inside a ``__del__`` or a weakref finalizer is printed and
dropped, and graphwatch runs many (one per saved tensor): without care, a
Ctrl-C pressed during training would often be lost.  :class:`SignalGuard`
sends such a signal again a moment later, until it lands in user code.
"""

from __future__ import annotations

import dis
import functools
import os
import signal
import sys
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from types import CodeType, FrameType
from typing import Any

from .capture.lines.callsite import is_user_file


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
        self.interrupted = False  # a Ctrl-C arrived after the script, while the report was written
        self._armed = False
        self._script_done = False
        self._sigchld: Any = None
        self._thread_errors: Any = None  # threading.excepthook before SIGTERM arrived
        self._unraisable: Any = None  # sys.unraisablehook before SIGTERM arrived
        self._active = sys.platform != "win32" and threading.current_thread() is threading.main_thread()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGTERM:
            self.terminated = True
            # The run ends: the script's frames unwind now, and a DataLoader freed on the way must not find
            # its workers (killed by a SIGTERM to the process group) through its SIGCHLD handler.
            self._shield_children(True)
        if not self._armed:
            if signum == signal.SIGINT:
                if self.interrupted or not self._script_done:
                    raise KeyboardInterrupt  # a second Ctrl-C: the user insists
                self.interrupted = True  # one Ctrl-C while the report is written: finish it first
            return
        if _interrupts_user_code(frame):
            self._armed = False  # one stop per run
            stop = Terminated("received SIGTERM") if signum == signal.SIGTERM else KeyboardInterrupt()
            if signum == signal.SIGTERM:
                _Unswallowable(stop).start(frame)
            raise stop
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
        self._shield_children(False)
        while self._previous:
            signum, handler = self._previous.popitem()
            if signal.getsignal(signum) == self._handle:  # a handler the user installed meanwhile stays
                signal.signal(signum, handler)

    def _shield_children(self, on: bool) -> None:
        """While the report is written, a child's death (SIGCHLD) runs none of the script's handlers, an error in
        another thread is not printed, and neither is the stop itself where Python drops it.

        torch's DataLoader raises "worker ... killed by signal" from its SIGCHLD handler: after a
        SIGTERM to the whole process group, that would cut the report short.  And a thread of the script's that
        talks to the killed workers (multiprocessing's resource sharer, mid-handshake) fails: without graphwatch
        SIGTERM would have ended the process before any other thread could say so.  A SIGTERM that lands in a
        callback whose exceptions Python prints and drops (the DataLoader forking a worker runs ``logging``'s
        ``os.register_at_fork`` callbacks) raises :class:`Terminated` there: it is raised again in the script's
        next line (:class:`_Unswallowable`), and not printed.
        """
        if not self._active:
            return
        if on and self._thread_errors is None:
            self._thread_errors, self._unraisable = threading.excepthook, sys.unraisablehook
            threading.excepthook = _ended_by_sigterm
            sys.unraisablehook = functools.partial(_unless_terminated, self._unraisable)
        elif not on and self._thread_errors is not None:
            if threading.excepthook is _ended_by_sigterm:  # (a hook set meanwhile stays)
                threading.excepthook = self._thread_errors
            hook = sys.unraisablehook
            if isinstance(hook, functools.partial) and hook.func is _unless_terminated:
                sys.unraisablehook = self._unraisable
            self._thread_errors = self._unraisable = None
        if not hasattr(signal, "SIGCHLD"):
            return
        if on and self._sigchld is None:
            self._sigchld = signal.signal(signal.SIGCHLD, ignore_signal)
        elif not on and self._sigchld is not None:
            if signal.getsignal(signal.SIGCHLD) is ignore_signal:
                signal.signal(signal.SIGCHLD, self._sigchld)
            self._sigchld = None

    def arm(self) -> None:
        """From now until exit, signals raise in the user's code (a session arms its Ctrl-C guard at once)."""
        self._armed = self._active

    def disarm(self) -> None:
        """The script is done: from now on a signal is only noted (``terminated``), so the report gets written."""
        self._armed = False
        self._script_done = True
        _Unswallowable.stop()
        self._shield_children(True)

    @contextmanager
    def armed(self) -> Iterator[None]:
        """Inside this block SIGTERM raises :class:`Terminated` and Ctrl-C ``KeyboardInterrupt`` in the script."""
        self._armed = self._active
        try:
            yield
        finally:
            self.disarm()


def _ended_by_sigterm(args: threading.ExceptHookArgs) -> None:
    """``threading.excepthook`` once SIGTERM arrived: an error in another thread is not printed (SIGTERM's default
    action would have ended the process first)."""


def _unless_terminated(previous: Any, unraisable: Any) -> None:
    """``sys.unraisablehook`` once SIGTERM arrived: the stop that Python dropped (raised in a finalizer or a fork
    callback) is not printed, anything else is, by the hook there was before."""
    if not isinstance(unraisable.exc_value, Terminated):
        previous(unraisable)


def ignore_signal(signum: int, frame: FrameType | None) -> None:
    """A handler that does nothing: what a signal's handler becomes while it must run none of the script's.
    Not ``SIG_DFL``: a signal that arrived just before the change is handled after it, and CPython raises
    "Signal 17 ignored due to race condition" wherever the script is when it finds ``SIG_DFL`` there (a SIGCHLD
    from a DataLoader worker killed by the same SIGTERM, inside the loader's shutdown)."""

def sigterm_guard() -> SignalGuard | None:
    """An entered and armed guard of SIGTERM where SIGTERM would kill the process outright (its default handler,
    in the main thread): a session stopped by it still writes its report and summary, then
    :func:`end_sigterm_guard` ends the process as SIGTERM would have.  None elsewhere.

    Example::

        >>> guard = sigterm_guard()
        >>> end_sigterm_guard(guard, os.getpid()) if guard is not None else None
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return None
    guard = SignalGuard(signals=(signal.SIGTERM,)).__enter__()
    guard.arm()
    return guard


def end_sigterm_guard(guard: SignalGuard, pid: int) -> None:
    """SIGTERM's default handler again; if SIGTERM arrived meanwhile (in process ``pid``, not a forked child), the
    process ends by it now."""
    guard.disarm()
    guard.__exit__(None, None, None)
    if guard.terminated and os.getpid() == pid:
        os.kill(os.getpid(), signal.SIGTERM)


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




class _Unswallowable:
    """After SIGTERM stopped the script: :class:`Terminated` again wherever the script goes on without it.

    Bare Python dies at the first SIGTERM; a ``try: ... except: pass`` around
    a training step would catch the exception graphwatch raises instead.  A
    trace function raises it again at the next line or call of the script's
    code that does not run while it is being handled (an ``except`` or
    ``finally`` body may run, as it would for any exception).
    """

    _current: _Unswallowable | None = None

    def __init__(self, stop: BaseException) -> None:
        self._stop = stop

    def start(self, frame: FrameType | None) -> None:
        """Trace ``frame`` and its callers, and every frame from now on, until :meth:`stop`."""
        _Unswallowable._current = self
        while frame is not None:
            if not _is_graphwatch(frame):
                frame.f_trace = self._trace
            frame = frame.f_back
        sys.settrace(self._trace)

    @classmethod
    def stop(cls) -> None:
        """The script has ended: no more tracing."""
        if cls._current is not None:
            cls._current = None
            sys.settrace(None)

    def _trace(self, frame: FrameType, event: str, arg: object) -> Any:
        if _is_graphwatch(frame):
            return None
        # Raised only where nothing of the script's can catch it: a trace function that raises is switched
        # off by Python, so a raise that a bare ``except:`` swallowed would leave the script running.
        if (
            event == "line"
            and is_user_file(frame.f_code.co_filename)  # the script's own line, never the standard library's
            and not isinstance(sys.exc_info()[1], Terminated)
            and _interrupts_user_code(frame)  # not in a finalizer (DataLoader's __del__) or a hook
            and _uncaught_here(frame)
        ):
            raise Terminated("received SIGTERM")
        return self._trace


def _uncaught_here(frame: FrameType | None) -> bool:
    """True when no frame of the script's (user code: not torch's, graphwatch's or the standard library's),
    from ``frame`` out to graphwatch's runner, is inside a ``try`` (or ``with``) block at its current
    instruction (Python 3.11+: the code's exception table says so)."""
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if filename in _OUTER_FILES:
            return True
        if filename.startswith(_PACKAGE_DIR):
            return False
        if is_user_file(frame.f_code.co_filename) and _in_handled_block(frame.f_code, frame.f_lasti):
            return False
        frame = frame.f_back
    return True


@functools.lru_cache(maxsize=512)
def _handled_ranges(code: CodeType) -> tuple[tuple[int, int], ...]:
    if not hasattr(code, "co_exceptiontable"):  # Python 3.10: blocks are not in a table
        return ()
    entries = dis.Bytecode(code).exception_entries  # type: ignore[attr-defined]  # 3.11+
    return tuple((entry.start, entry.end) for entry in entries)


def _in_handled_block(code: CodeType, offset: int) -> bool:
    return any(start <= offset < end for start, end in _handled_ranges(code))


def _is_graphwatch(frame: FrameType) -> bool:
    return os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR)
