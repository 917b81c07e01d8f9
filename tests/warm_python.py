"""``python [-W OPTION]... SCRIPT ARGS`` and ``python [-W OPTION]... -m MODULE ARGS`` for the tests, without paying
torch's start-up each time.

Most of what a test that starts a script pays is not the script: it is importing torch (about a second of CPU
on a quiet machine, three on a busy one) and tearing the interpreter down again at the end (about as much:
every module object is freed).  :func:`run` takes the same arguments as :func:`subprocess.run` for a Python
command and gives the same :class:`subprocess.CompletedProcess`, from a real process forked off a server that
imported torch and graphwatch once (one server per pytest process, started at first use).  The child is set up
as the interpreter sets up a fresh one: its own working folder, environment, ``sys.argv``, ``sys.path[0]``,
standard streams (pipes, as ``capture_output=True`` gives), ``__main__``; an uncaught exception prints its
traceback (without this module's frames) and exits 1, ``SystemExit`` exits as it says.  It ends as Python ends
except for the module teardown: ``atexit`` handlers run and the streams are flushed, then it exits.

Where a fork could differ from a fresh interpreter, the command runs as a real cold start instead (through
:func:`subprocess.run`): an environment that differs from the server's in what Python, torch or OpenMP read at
start-up (``PYTHON*``, ``OMP_*``, ``TORCH*``, locale, ``LD_*``, ...), an interpreter other than this one, an
interpreter option other than ``-W``, or ``GRAPHWATCH_TEST_COLD=1``.  Tests about start-up itself (import cost, the
install, locales, signals, tracebacks of a bare script) call :func:`subprocess.run` directly.

Example::

    >>> done = run([sys.executable, "-m", "graphwatch", "--version"], capture_output=True, text=True)
    >>> done.returncode, done.stdout.startswith("graphwatch")
    (0, True)
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import pkgutil
import re
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

# What the interpreter, torch or OpenMP read when they start: a child forked from the server has them as the
# server had them, so a command whose environment differs there runs cold.
# (PYTHONPATH and PYTHONWARNINGS excepted: the child sets sys.path and the warning filters from them as the
# interpreter does, unless a PYTHONPATH folder holds a sitecustomize, which only a fresh start runs; and caches'
# folders, read when first used: torch sets TORCHINDUCTOR_CACHE_DIR in the test process at its first optimizer)
_READ_AT_START = re.compile(
    r"(?!.*CACHE)(PYTHON(?!PATH$|WARNINGS$)|OMP_|GOMP|KMP_|MKL_|OPENBLAS|TORCH|PYTORCH|CUDA|LD_|LC_|LANG$|LANGUAGE$)"
)
_server: tuple[subprocess.Popen[bytes], socket.socket] | None = None
_started: dict[str, str] = {}  # the environment the server started with


def run(args: Sequence[str], *, cwd: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None,
        input: str | bytes | None = None, capture_output: bool = False, text: bool = False,
        timeout: float | None = None, check: bool = False) -> subprocess.CompletedProcess[Any]:
    """:func:`subprocess.run` for ``[sys.executable, *("-W", OPTION)..., SCRIPT | "-m" MODULE, *ARGS]``, forked off a
    warm server."""
    env = dict(os.environ if env is None else env)
    forks = _can_fork(args, env)
    if not forks and _started and _can_fork(args, env, started=os.environ):
        _start_again()  # this process's own start-up variables changed (an import set TORCH_...): not every run cold
        forks = True
    if not forks:
        return subprocess.run(list(args), cwd=cwd, env=env, input=input, capture_output=capture_output, text=text,
                              timeout=timeout, check=check)  # fmt: skip
    data = input.encode() if isinstance(input, str) else input
    out, err, code = _forked(list(args[1:]), os.fspath(cwd or os.getcwd()), env, data or b"", capture_output, timeout,
                             args)  # fmt: skip
    stdout: Any = out.decode(errors="replace") if text and out is not None else out
    stderr: Any = err.decode(errors="replace") if text and err is not None else err
    done = subprocess.CompletedProcess(list(args), code, stdout, stderr)
    if check:
        done.check_returncode()
    return done


def _can_fork(args: Sequence[str], env: Mapping[str, str], started: Mapping[str, str] | None = None) -> bool:
    """Whether ``args`` run with ``env`` can be forked off a server started with ``started`` (the running one's)."""
    if os.environ.get("GRAPHWATCH_TEST_COLD") == "1" or not hasattr(os, "fork") or len(args) < 2:
        return False
    _, argv = _warn_options(args[1:])
    if args[0] != sys.executable or not argv or (argv[0].startswith("-") and argv[0] != "-m"):
        return False
    started = started or _started or os.environ
    if any(os.path.isfile(os.path.join(folder, name)) for folder in env.get("PYTHONPATH", "").split(os.pathsep)
           if folder for name in ("sitecustomize.py", "usercustomize.py")):  # fmt: skip
        return False
    return all(env.get(k) == started.get(k) for k in {*env, *started} if _READ_AT_START.match(k))


def _connection() -> socket.socket:
    """The socket to this process's server, started (again, if it ended) with this process's environment."""
    global _server, _started
    if _server is None or _server[0].poll() is not None:
        ours, theirs = socket.socketpair()
        _started = _started or dict(os.environ)
        process = subprocess.Popen(
            [sys.executable, "-c", f"import warm_python; warm_python.serve({theirs.fileno()})"],
            cwd=os.path.dirname(os.path.abspath(__file__)), env=_started, pass_fds=[theirs.fileno()],
        )  # fmt: skip
        theirs.close()
        if _server is None:
            atexit.register(_stop_server)
        _server = (process, ours)
    return _server[1]


def _start_again() -> None:
    """End the server; the next run starts one with this process's environment as it is now."""
    global _started
    _stop_server()
    _started = dict(os.environ)


def _stop_server() -> None:
    """End the server at exit and wait for it, so that its CPU time (and its children's) counts as this process's
    children's, as ``/usr/bin/time`` and ``resource.getrusage(RUSAGE_CHILDREN)`` show it."""
    if _server is not None:
        _server[1].close()  # (the server ends when its socket does)
        _server[0].wait()


def _forked(argv: list[str], cwd: str, env: dict[str, str], data: bytes, capture: bool, timeout: float | None,
            args: Sequence[str]) -> tuple[bytes | None, bytes | None, int]:
    """Run ``argv`` in a child of the server; its output (when captured) and exit code."""
    conn = _connection()
    stdin_r, stdin_w = os.pipe()
    pipes = [os.pipe() for _ in range(2)] if capture else []
    outs = [w for _, w in pipes] if capture else [1, 2]
    request = json.dumps({"argv": argv, "cwd": cwd, "env": env}).encode()
    socket.send_fds(conn, [len(request).to_bytes(8, "big") + request], [stdin_r, *outs])
    os.close(stdin_r)
    for _, w in pipes:
        os.close(w)
    pid = int.from_bytes(_read_exactly(conn, 8), "big")
    deadline = None if timeout is None else time.monotonic() + timeout
    chunks: dict[int, list[bytes]] = {r: [] for r, _ in pipes}
    open_fds = [r for r, _ in pipes]
    try:
        _feed(stdin_w, data, deadline)
        while open_fds:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError
            ready, _, _ = select.select(open_fds, [], [], left)
            for fd in ready:
                chunk = os.read(fd, 1 << 16)
                if chunk:
                    chunks[fd].append(chunk)
                else:
                    open_fds.remove(fd)
        status = int.from_bytes(_read_exactly(conn, 8, deadline), "big", signed=True)
    except TimeoutError:
        os.kill(pid, signal.SIGKILL)
        _read_exactly(conn, 8)
        raise subprocess.TimeoutExpired(list(args), timeout or 0) from None
    finally:
        for fd in [*open_fds, stdin_w]:
            _close(fd)
        for r, _ in pipes:
            _close(r)
    if not capture:
        return None, None, status
    return b"".join(chunks[pipes[0][0]]), b"".join(chunks[pipes[1][0]]), status


def _feed(fd: int, data: bytes, deadline: float | None) -> None:
    """Write the child's standard input and close it (as ``input=`` does); a child that stops reading is fine."""
    try:
        view = memoryview(data)
        while view:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([], [fd], [], left)[1]:
                raise TimeoutError
            view = view[os.write(fd, view[: 1 << 16]) :]
    except BrokenPipeError:
        pass
    finally:
        _close(fd)


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _read_exactly(conn: socket.socket, size: int, deadline: float | None = None) -> bytes:
    data = b""
    while len(data) < size:
        conn.settimeout(None if deadline is None else max(0.001, deadline - time.monotonic()))
        chunk = conn.recv(size - len(data))  # (a timeout raises TimeoutError)
        if not chunk:
            raise RuntimeError("the warm Python server ended")
        data += chunk
    return data


# ------------------------------------------------------------------ the server, and the child it forks
def serve(fd: int) -> None:
    """The server: import what every test script imports (``torch._dynamo`` too, which a script's first
    ``torch.optim.Optimizer`` imports), then fork a child per request, reporting its pid and its exit status (as
    :attr:`subprocess.Popen.returncode` gives it)."""
    import warnings

    startup_filters = list(warnings.filters)
    import torch
    import torch._dynamo  # noqa: F401  # (a script's first optimizer imports it: 2-3 s of CPU in each child)

    import graphwatch
    import graphwatch.cli  # noqa: F401

    # what a run loads on first use (lazy since issue 41): LibCST and the codemods for a finding's patch, the
    # renderers for its summary and report (about 0.5 s of CPU in each child otherwise)
    for package in ("graphwatch.analysis.codemods", "graphwatch.rendering"):
        for module in pkgutil.iter_modules(importlib.import_module(package).__path__, f"{package}."):
            importlib.import_module(module.name)

    global _SETUP
    added = warnings.filters[: len(warnings.filters) - len(startup_filters)]  # (what importing them filtered)
    _SETUP = {"filters": (added, startup_filters), "path": _without_pythonpath(sys.path[1:], os.environ)}
    conn = socket.socket(fileno=fd)
    while True:
        head = conn.recv(8, socket.MSG_PEEK)
        if not head:
            return
        message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        size = int.from_bytes(message[:8], "big")
        while len(message) < size + 8:
            message += conn.recv(size + 8 - len(message))
        request = json.loads(message[8:])
        pid = os.fork()
        if pid == 0:
            conn.close()
            _child(request, fds)
        for child_fd in fds:
            os.close(child_fd)
        conn.sendall(pid.to_bytes(8, "big"))
        _, status = os.waitpid(pid, 0)
        conn.sendall(os.waitstatus_to_exitcode(status).to_bytes(8, "big", signed=True))


def _child(request: dict[str, Any], fds: list[int]) -> None:
    """Become ``python ARGV`` in ``request``'s folder and environment; never returns."""
    import atexit
    import runpy
    import traceback

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    take_place(request["cwd"], request["env"])
    options, argv = _warn_options(request["argv"])
    _as_started(os.environ, options)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    code, interrupted = 0, False
    try:
        if argv[0] == "-m":
            sys.argv = ["-m", *argv[2:]]  # (runpy puts the module's file first, as `python -m` does)
            sys.path[0] = os.getcwd()
            runpy._run_module_as_main(argv[1])  # type: ignore[attr-defined]
        else:
            sys.argv = list(argv)
            _run_as_main(os.path.abspath(argv[0]))
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException as exc:  # (the interpreter's own last word on an uncaught exception)
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__, "<frozen runpy>"):
            tb = tb.tb_next
        traceback.print_exception(type(exc), exc, tb)
        code, interrupted = 1, isinstance(exc, KeyboardInterrupt)
    try:
        atexit._run_exitfuncs()
    finally:
        flush_standard_streams()
        if interrupted:  # (Python ends an uncaught Ctrl-C by SIGINT, so that its parent sees the signal)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code)


def take_place(cwd: str, env: Mapping[str, str]) -> None:
    """A forked child takes the place of a fresh interpreter started in ``cwd`` with ``env``."""
    import tempfile

    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # (the server's, cached: a fresh interpreter reads $TMPDIR at first use)


def flush_standard_streams() -> None:
    """Flush ``sys.stdout`` and ``sys.stderr`` as the interpreter does at its end (a forked child's last act
    before ``os._exit``)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # (a closed stream has nothing left to write)
            pass


_SETUP: dict[str, Any] = {}  # the server's: warning filters (torch's own, the interpreter's) and sys.path[1:]


def _without_pythonpath(path: list[str], env: Mapping[str, str]) -> list[str]:
    """``path`` without the folders PYTHONPATH in ``env`` put there."""
    named = {os.path.abspath(folder) for folder in env.get("PYTHONPATH", "").split(os.pathsep) if folder}
    return [entry for entry in path if os.path.abspath(entry) not in named]


def _warn_options(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """The options of the ``-W OPTION`` pairs that lead ``argv`` (the interpreter's arguments), and the rest."""
    options: list[str] = []
    while len(argv) >= 2 and argv[0] == "-W":
        options.append(argv[1])
        argv = argv[2:]
    return options, list(argv)


def _as_started(env: Mapping[str, str], warn_options: Sequence[str]) -> None:
    """``sys.path[1:]`` and the warning filters as the interpreter sets them from ``env``'s PYTHONPATH and
    PYTHONWARNINGS and the ``-W`` options at start-up, below what importing torch and graphwatch filtered."""
    import warnings

    sys.path[1:] = [folder for folder in env.get("PYTHONPATH", "").split(os.pathsep) if folder] + _SETUP["path"]
    added, startup = _SETUP["filters"]
    sys.warnoptions[:] = [*(option for option in env.get("PYTHONWARNINGS", "").split(",") if option), *warn_options]
    warnings.filters[:] = []
    warnings._processoptions(sys.warnoptions)  # type: ignore[attr-defined]
    warnings.filters[:] = [*added, *warnings.filters, *startup]
    warnings._filters_mutated()  # type: ignore[attr-defined]


def _run_as_main(script: str) -> None:
    """Run ``script`` (an absolute path) as ``python SCRIPT`` runs it: its folder first on ``sys.path``, its code
    (named by that path) in a new ``__main__`` module; ``sys.argv`` is left as given."""
    import builtins
    import types
    from importlib.machinery import SourceFileLoader

    sys.path[0] = os.path.dirname(script)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=script, __builtins__=builtins, __loader__=SourceFileLoader("__main__", script),
                         __spec__=None, __package__=None)  # fmt: skip
    sys.modules["__main__"] = main
    with open(script, "rb") as source:
        code = compile(source.read(), script, "exec")
    exec(code, main.__dict__)


def _exit_code(exc: SystemExit) -> int:
    """The exit code of ``sys.exit(value)``, as the interpreter computes it."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1

