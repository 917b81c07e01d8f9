"""Where a ``--check-fixes`` patched run starts: forked off a warm "zygote" process, or as a cold Python.

A patched run is ``python -m graphwatch run --stop-after N ...`` in a session of its own.  Started cold, it pays
Python's, torch's and graphwatch's imports again (2-3 s of CPU a check).  So ``graphwatch run --check-fixes``
calls :func:`start_zygote` before the script runs (torch and graphwatch imported, no torch op run, so no
intra-op thread a fork would lose): it forks a small process that waits on a socket and never sees the script's
state.  The zygote then imports ``torch._dynamo`` (it starts no thread), which a script's first optimizer would
import in each patched run (another 2-3 s of CPU a check), while the script runs.  :func:`start_run` asks it for
each patched run, and it forks a grandchild that does what the cold process does: a new session (``os.setsid``),
the run's folder and environment (``os.environ`` replaced, ``sys.path`` set from it as ``python -m`` sets it),
standard input from ``/dev/null``, the output the caller gives, the signal dispositions graphwatch started with
(Python's own, before graphwatch's guard), the same ``python -m graphwatch ARGS`` entry in-process, and an exit
as Python's: threads joined, ``atexit`` handlers run, streams flushed, the exit code reported as
:attr:`subprocess.Popen.returncode` gives it.  The grandchild stays unreaped until the caller has ended its
process group (:meth:`PatchedProcess.end`), so its group's id is never another's.

The zygote is no child of graphwatch (a script that waits for all its children never waits for it) and no
member of its terminal's process group (Ctrl-C never reaches it).  It ends when :func:`stop_zygote` says so
(also at graphwatch's exit), when its socket closes, or when graphwatch's process is gone (killed outright),
killing the patched run it was watching.

A patched run starts cold, as ``python -m graphwatch`` (:func:`start_run`), when ``GRAPHWATCH_CHECK_COLD=1``,
where ``os.fork`` is missing or unsafe (not Linux), when the interpreter was started with options (``-O``,
``-W``, ``-X``, ...: a cold ``python -m`` gets none), when the run's environment differs from the zygote's in
what Python, torch or OpenMP read at start-up (:data:`READ_AT_START`, e.g. a script that set
``OMP_NUM_THREADS``), when a folder added to ``PYTHONPATH`` holds a ``sitecustomize``, and when the zygote has
died.

Example (which environments a zygote started with 2 OpenMP threads can serve)::

    >>> ours, theirs = socket.socketpair()
    >>> zygote = Zygote(ours, {"OMP_NUM_THREADS": "2"})
    >>> zygote.fits({"OMP_NUM_THREADS": "2", "TORCHINDUCTOR_CACHE_DIR": "/tmp/c"}), zygote.fits({"OMP_NUM_THREADS": "1"})
    (True, False)
    >>> ours.close(); theirs.close()
"""

from __future__ import annotations

import atexit
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

COLD_VARIABLE = "GRAPHWATCH_CHECK_COLD"  # "1": every patched run starts as a cold Python
POLL_SECONDS = 0.05  # how often the zygote looks for graphwatch's end where it cannot wait for it (no pidfd)
QUIT = (0).to_bytes(8, "big")  # a request of no length: the zygote ends
REAP = b"r"  # the patched run's process group is ended: the zygote may reap it
# What the interpreter, torch or OpenMP read when they start: a process forked from the zygote has them as
# graphwatch had them, so a run whose environment differs there starts cold.  Excepted: PYTHONPATH (the
# grandchild sets sys.path from it, as the interpreter does) and caches' folders (read when first used; torch
# sets TORCHINDUCTOR_CACHE_DIR to its default during a run).
READ_AT_START = re.compile(r"(?!.*CACHE)(PYTHON(?!PATH$)|OMP_|GOMP|KMP_|MKL_|OPENBLAS|TORCH|PYTORCH|CUDA|LD_|LC_|LANG$|LANGUAGE$)")


class PatchedProcess(Protocol):
    """A started patched run, leader of a process group of its own."""

    pid: int
    returncode: int | None  # as subprocess.Popen gives it (a signal's as its negative number); None: not known

    def has_ended(self) -> bool:
        """Whether it ended (its process group may live on), without waiting."""

    def end(self) -> None:
        """Kill every process of its group, then reap it (``returncode`` is set)."""


class ColdProcess:
    """A patched run started as ``python -m graphwatch ARGS`` (:class:`subprocess.Popen`, a new session)."""

    def __init__(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str], stderr: int) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "graphwatch", *argv], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True,
        )  # fmt: skip
        self.pid = self._process.pid
        self.returncode: int | None = None

    def has_ended(self) -> bool:
        """Left unreaped where the system allows, so that its process group stays its own until :meth:`end`."""
        if hasattr(os, "waitid"):
            return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        return self._process.poll() is not None

    def end(self) -> None:
        _kill_group(self.pid)
        self.returncode = self._process.wait()


class WarmProcess:
    """A patched run forked off the zygote, which tells its pid and, when it ends, its exit status."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self._zygote = zygote
        self.pid = pid
        self.returncode: int | None = None
        self._ended = False

    def has_ended(self) -> bool:
        if not self._ended and select.select([self._zygote.sock], [], [], 0)[0]:
            self._receive_status()
        return self._ended

    def end(self) -> None:
        _kill_group(self.pid)
        if not self._ended:
            self._receive_status()
        try:
            self._zygote.sock.sendall(REAP)
        except OSError:
            stop_zygote()

    def _receive_status(self) -> None:
        self._ended = True
        try:
            self.returncode = int.from_bytes(_receive_exactly(self._zygote.sock, 8), "big", signed=True)
        except OSError:  # the zygote died: its run is not watched any more (ended by its group's kill)
            stop_zygote()


class Zygote:
    """graphwatch's side of the zygote: its socket, and the environment it was forked with."""

    def __init__(self, sock: socket.socket, env: Mapping[str, str]) -> None:
        self.sock = sock
        self.env = dict(env)
        self.owner = os.getpid()  # (a process the script forked must not speak for graphwatch)

    def fits(self, env: Mapping[str, str]) -> bool:
        """Whether a run in ``env`` started from here computes what a cold start would."""
        if any(env.get(k) != self.env.get(k) for k in {*env, *self.env} if READ_AT_START.match(k)):
            return False
        known = set(_pythonpath(self.env))
        return not any(
            os.path.isfile(os.path.join(folder, name)) for folder in _pythonpath(env) if folder not in known
            for name in ("sitecustomize.py", "usercustomize.py")
        )  # fmt: skip

    def spawn(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str], stderr: int) -> WarmProcess:
        """Ask for a grandchild running ``python -m graphwatch ARGV`` (raises OSError when the zygote has gone)."""
        request = json.dumps({"argv": list(argv), "cwd": str(cwd), "env": dict(env)}).encode()
        null = os.open(os.devnull, os.O_RDWR)
        try:
            socket.send_fds(self.sock, [len(request).to_bytes(8, "big") + request], [null, null, stderr])
        finally:
            os.close(null)
        return WarmProcess(self, int.from_bytes(_receive_exactly(self.sock, 8), "big"))


_zygote: Zygote | None = None


def start_zygote() -> None:
    """Fork the zygote (once; nothing where a patched run must start cold anyway).  Call before the script runs."""
    global _zygote
    if _zygote is not None or not _may_fork():
        return
    for stream in (sys.stdout, sys.stderr):  # (nothing written before the fork is written twice)
        if stream is not None:
            stream.flush()
    ours, theirs = socket.socketpair()
    graphwatch = os.getpid()
    pid = os.fork()
    if pid == 0:  # detached: a session of its own, then a child of its own that init adopts
        try:
            ours.close()
            os.setsid()
            if os.fork() == 0:
                _serve(theirs, graphwatch)
        finally:
            os._exit(0)
    theirs.close()
    os.waitpid(pid, 0)
    _zygote = Zygote(ours, os.environ)
    atexit.register(stop_zygote)


def stop_zygote() -> None:
    """End the zygote (it was idle: no patched run is running) and wait, briefly, until it has."""
    global _zygote
    if _zygote is None or _zygote.owner != os.getpid():
        return
    zygote, _zygote = _zygote, None
    try:
        zygote.sock.sendall(QUIT)
        zygote.sock.settimeout(1.0)
        while zygote.sock.recv(1 << 12):  # (its end closes when it exits)
            pass
    except OSError:  # gone already, or slow: it ends on its own
        pass
    zygote.sock.close()


def start_run(argv: Sequence[str], cwd: Path, env: Mapping[str, str], stderr: int) -> PatchedProcess:
    """``python -m graphwatch ARGV`` in ``cwd`` with ``env``, standard input from /dev/null, standard output to
    /dev/null and standard error to ``stderr``, in a session of its own: forked off the zygote when there is one
    and it fits ``env``, else a cold start."""
    if _zygote is not None and _zygote.owner == os.getpid() and _zygote.fits(env):
        try:
            return _zygote.spawn(argv, cwd, env, stderr)
        except OSError:  # the zygote died
            stop_zygote()
    return ColdProcess(argv, cwd, env, stderr)


def _may_fork() -> bool:
    """Whether a process forked from this one can start a patched run as a cold ``python -m`` would."""
    if os.environ.get(COLD_VARIABLE) == "1" or sys.platform != "linux" or not hasattr(socket, "send_fds"):
        return False
    options = []  # the interpreter's own options, before its -m / -c / script
    for arg in getattr(sys, "orig_argv", [sys.executable, "?"])[1:]:
        if not arg.startswith("-") or arg in ("-m", "-c"):
            break
        options.append(arg)
    return not options


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # none left
        pass


def _receive_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionResetError("the zygote ended")
        data += chunk
    return data


def _pythonpath(env: Mapping[str, str]) -> list[str]:
    return [folder for folder in env.get("PYTHONPATH", "").split(os.pathsep) if folder]


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when process ``pid`` ends, where the system has them."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


# ------------------------------------------------------------------ the zygote, and the runs it forks
def _serve(sock: socket.socket, graphwatch: int) -> None:
    """The zygote: fork a patched run per request, report its pid and exit status, reap it when told."""
    null = os.open(os.devnull, os.O_RDWR)  # (graphwatch's pipes must see their end when graphwatch ends)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    _import_what_runs_import()
    watched = _pidfd(graphwatch)
    base = [entry for entry in sys.path[1:] if entry not in {os.path.abspath(f) for f in _pythonpath(os.environ)}]
    while _wait_for(sock, watched, graphwatch, None):
        message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
        if len(message) < 8 or message[:8] == QUIT:
            return
        size = int.from_bytes(message[:8], "big")
        while len(message) < size + 8:
            message += _receive_exactly(sock, size + 8 - len(message))
        pid = os.fork()
        if pid == 0:
            sock.close()
            if watched is not None:
                os.close(watched)
            _become(json.loads(message[8:]), fds, base)
        for fd in fds:
            os.close(fd)
        sock.sendall(pid.to_bytes(8, "big"))
        if not _wait_for(sock, watched, graphwatch, pid):  # graphwatch has gone, or closed the socket
            _kill_group(pid)
            os.waitpid(pid, 0)
            return
        sock.sendall(_returncode(pid).to_bytes(8, "big", signed=True))
        told = _wait_for(sock, watched, graphwatch, None) and sock.recv(1) == REAP
        os.waitpid(pid, 0)
        if not told:
            return


def _import_what_runs_import() -> None:
    """Import, once for every patched run, what a training script imports through torch on first use and no thread
    starts for: ``torch._dynamo`` (``torch.optim.Optimizer.__init__`` imports it)."""
    try:
        import torch._dynamo  # noqa: F401
    except ImportError:  # (a torch without it: a patched run goes without it as well)
        pass


def _wait_for(sock: socket.socket, watched: int | None, graphwatch: int, run: int | None) -> bool:
    """Wait until the socket has something to read (the run ``run`` is None) or that run ended (True), or
    graphwatch has gone (False); a run's end is left unreaped."""
    child = _pidfd(run) if run is not None else None
    try:
        while True:
            if run is not None and os.waitid(os.P_PID, run, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
            fds = [sock.fileno(), *(fd for fd in (watched, child) if fd is not None)]
            polled = watched is None or (run is not None and child is None)
            ready = select.select(fds, [], [], POLL_SECONDS if polled else None)[0]
            if (watched is not None and watched in ready) or (watched is None and not _alive(graphwatch)):
                return False
            if sock.fileno() in ready:
                return run is None  # (during a run, graphwatch sends nothing: the socket closed)
    finally:
        if child is not None:
            os.close(child)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _returncode(pid: int) -> int:
    """The exit status of the ended (unreaped) child ``pid``, as :attr:`subprocess.Popen.returncode` gives it."""
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    assert info is not None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def _become(request: dict[str, object], fds: list[int], base: list[str]) -> None:
    """Be ``python -m graphwatch ARGV`` started cold in ``request``'s folder and environment; never returns."""
    import importlib
    import runpy

    from .runner import EXIT_ERROR, exit_code_of

    code = EXIT_ERROR
    try:
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(str(request["cwd"]))
        env = request["env"]
        assert isinstance(env, dict)
        os.environ.clear()
        os.environ.update(env)
        sys.path[:] = [os.getcwd(), *_pythonpath(os.environ), *base]  # as `python -m` sets it
        importlib.invalidate_caches()
        _as_new()
        argv = request["argv"]
        assert isinstance(argv, list)
        sys.argv = ["-m", *map(str, argv)]
        runpy.run_module("graphwatch", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exit_code_of(exc)
    except BaseException as exc:  # (Python's own last word on an uncaught exception)
        sys.excepthook(type(exc), exc, exc.__traceback__)
    finally:
        _exit(code)


def _as_new() -> None:
    """What a fresh process computes at first use, forgotten: the temporary folder (read from the environment),
    NumPy's global generator (drawn afresh; ``random`` reseeds itself at a fork)."""
    import tempfile

    tempfile.tempdir = None
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()


def _exit(code: int) -> None:
    """End as Python ends: wait for the threads, run ``atexit`` handlers, collect, flush; then exit ``code``."""
    import gc
    import threading

    try:
        getattr(threading, "_shutdown", lambda: None)()
        atexit._run_exitfuncs()
        gc.collect()
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except BaseException:  # (what Python prints of an exit handler's failure went to stderr already)
        pass
    os._exit(code)
