"""``python -c CODE`` as a fresh interpreter runs it right after ``import torch``, for the tests of what
importing and running graphwatch loads (tests/test_import_cost.py), without paying Python's and torch's start-up
in each.

:func:`run` forks the child off a "lean" server: an interpreter started as the test's own (same executable,
environment, ``site-packages``, so that the pytest plugin's entry point is there), that imported ``torch`` and
nothing of graphwatch, LibCST, rich or graphviz (it checks so before serving), and so has in ``sys.modules``
what a user's fresh interpreter has after ``import torch``, plus a few standard-library modules this one uses;
a test may ask for more (``after_torch``: e.g. ``torch._dynamo``, which a script's first optimizer imports).
(tests/warm_python.py's server cannot serve these tests: it imported graphwatch and all its renderers.)

The child is set up as ``python -c CODE`` sets up a fresh interpreter: the request's working folder and
environment, ``sys.argv == ["-c"]``, ``""`` first on ``sys.path``, a new ``__main__``, standard input from
``/dev/null``, its output captured; an uncaught exception prints its traceback and exits 1, ``SystemExit`` exits
as it says, ``atexit`` handlers run and the streams are flushed at the end.  One server per pytest process,
started at first use and ended (and waited for, so that its CPU time counts) at exit.

Example::

    >>> done = run("import sys; print('graphwatch' in sys.modules, 'torch' in sys.modules)", os.getcwd())
    >>> done.returncode, done.stdout
    (0, 'False True\\n')
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

# what the server must not have imported: what the tests look for in the child's sys.modules
NOT_PRELOADED = ("graphwatch", "libcst", "rich", "graphviz", "pytest")
_server: subprocess.Popen[bytes] | None = None
_imported: set[str] = set()  # what the running server imported after torch
_unread = b""  # what the server answered that no caller has read yet


def run(
    code: str, cwd: str | os.PathLike[str], after_torch: Sequence[str] = (), timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=timeout)``,
    forked off the lean server after its ``import torch`` and then its imports of the modules ``after_torch``
    names (none of :data:`NOT_PRELOADED`): e.g. ``torch._dynamo``, which a script's first optimizer imports
    (2-3 s of CPU).  A server that imported a module ``after_torch`` does not name is ended and a new one started."""
    server = _connection(after_torch)
    assert server.stdin is not None
    with tempfile.TemporaryDirectory(prefix="lean-python-") as folder:
        out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
        request = {"code": code, "cwd": os.fspath(cwd), "env": dict(os.environ), "import": list(after_torch),
                   "stdout": out, "stderr": err}  # fmt: skip
        server.stdin.write(json.dumps(request).encode() + b"\n")
        server.stdin.flush()
        _imported.update(after_torch)
        pid = int(_answer(server, None))
        try:
            status = int(_answer(server, time.monotonic() + timeout))
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            _answer(server, None)
            raise subprocess.TimeoutExpired([sys.executable, "-c", code], timeout) from None
        with open(out, errors="replace") as stdout, open(err, errors="replace") as stderr:
            return subprocess.CompletedProcess([sys.executable, "-c", code], status, stdout.read(), stderr.read())


def _connection(after_torch: Sequence[str]) -> subprocess.Popen[bytes]:
    """This process's lean server, started (again) at first use, if it ended, or if it imported a module
    ``after_torch`` does not name."""
    global _server, _unread
    if _server is not None and not _imported <= set(after_torch):
        _stop_server()
    if _server is None or _server.poll() is not None:
        if _server is None:
            atexit.register(_stop_server)
        _server = subprocess.Popen(
            [sys.executable, "-c", "import lean_python; lean_python.serve()"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, bufsize=0, cwd=os.path.dirname(os.path.abspath(__file__)),
        )  # fmt: skip
        _imported.clear()
        _unread = b""
    return _server


def _answer(server: subprocess.Popen[bytes], deadline: float | None) -> str:
    """The server's next line (a child's pid, or its exit status), waiting until ``deadline`` at most."""
    global _unread
    assert server.stdout is not None
    while b"\n" not in _unread:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not select.select([server.stdout], [], [], left)[0]:
            raise TimeoutError
        chunk = os.read(server.stdout.fileno(), 64)
        if not chunk:
            raise RuntimeError("the lean Python server ended")
        _unread += chunk
    line, _, _unread = _unread.partition(b"\n")
    return line.decode()


def _stop_server() -> None:
    """End the server at exit and wait for it, so that its CPU time (and its children's) counts as this process's
    children's, as ``/usr/bin/time`` shows it."""
    if _server is not None:
        for pipe in (_server.stdin, _server.stdout):  # (the server ends when its standard input does)
            if pipe is not None:
                pipe.close()
        _server.wait()


# ------------------------------------------------------------------ the server, and the child it forks
def serve() -> None:
    """The server: ``import torch``, then per request line on standard input import the modules it names (if not
    yet) and fork a child, answering its pid and its exit status (as :attr:`subprocess.Popen.returncode` gives
    it) on standard output."""
    import torch  # noqa: F401

    for line in sys.stdin:
        request = json.loads(line)
        for name in request["import"]:
            importlib.import_module(name)
        preloaded = [name for name in sys.modules if name.partition(".")[0] in NOT_PRELOADED]
        assert not preloaded, f"the lean server must not have imported {preloaded}"
        pid = os.fork()
        if pid == 0:
            try:
                _child(request)
            except BaseException:  # (the child's set-up failed: it says so and ends, never serving)
                traceback.print_exc()
            os._exit(1)
        print(pid, flush=True)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)


def _child(request: dict[str, Any]) -> NoReturn:
    """Become ``python -c CODE`` in ``request``'s folder and environment; never returns."""
    import builtins
    import types

    import warm_python  # (the standard library only)

    for target, (name, flags) in enumerate([(os.devnull, os.O_RDONLY), (request["stdout"], os.O_WRONLY | os.O_CREAT),
                                            (request["stderr"], os.O_WRONLY | os.O_CREAT)]):  # fmt: skip
        fd = os.open(name, flags, 0o600)
        os.dup2(fd, target)
        os.close(fd)
    warm_python.take_place(request["cwd"], request["env"])
    # (sys.argv == ["-c"] and "" first on sys.path: the server started as `python -c`, as the child's own start)
    main = types.ModuleType("__main__")
    main.__dict__.update(__builtins__=builtins)
    sys.modules["__main__"] = main
    code = 0
    try:
        exec(compile(request["code"], "<string>", "exec"), main.__dict__)
    except SystemExit as exc:
        code = warm_python._exit_code(exc)
    except BaseException as exc:  # (the interpreter's own last word on an uncaught exception)
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None)
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        warm_python.flush_standard_streams()
        os._exit(code)
