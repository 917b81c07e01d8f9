"""Scripts run as :func:`warm_python.run` runs them (forked off a warm server), driven from outside as a user's
shell or terminal drives a process: stopped by a signal once ready, or writing to streams other than pipes.

The tests of how a run ends on SIGTERM or Ctrl-C need the signal to arrive while the script trains, sent by
another process as a user's ``kill`` or terminal sends it.  A forked child's output reaches the test only when
it ends, so the script tells that it is ready by writing its process id to the file :data:`READY` in its working
folder (the line :data:`SAY_READY` does it); :func:`run_and_signal` then sends the signal to that process and
gives the :class:`subprocess.CompletedProcess` of the run.  Waits are bounded by the timeout, never timed.

A child that captures nothing writes to this process's standard streams, as :func:`subprocess.run` gives them;
:func:`standard_streams` makes them, for a while, a terminal or a pipe the test reads.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import warm_python

READY = "ready.pid"
# (a statement for the script; the reader takes the id once its line is whole)
SAY_READY = f"__import__('pathlib').Path({READY!r}).write_text(f'{{__import__(\"os\").getpid()}}\\n')"


class InBackground:
    """``warm_python.run(args, **options)`` in a thread of this process: the test drives the script meanwhile."""

    def __init__(self, args: Sequence[str], **options: Any) -> None:
        self._ended: list[subprocess.CompletedProcess[Any]] = []
        self._failed: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(args, options), daemon=True)
        self._thread.start()

    def _run(self, args: Sequence[str], options: dict[str, Any]) -> None:
        try:
            self._ended.append(warm_python.run(args, **options))
        except BaseException as exc:  # (raised again in the test's thread, by result())
            self._failed.append(exc)

    def running(self) -> bool:
        return self._thread.is_alive()

    def result(self, timeout: float) -> subprocess.CompletedProcess[Any]:
        """How the run ended (waiting for it at most ``timeout`` seconds)."""
        self._thread.join(timeout)
        if self._failed:
            raise self._failed[0]
        assert self._ended, f"the script did not end within {timeout:g} s"
        return self._ended[0]


def run_and_signal(args: Sequence[str], signum: int, *, cwd: Path, env: Mapping[str, str],
                   timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``args`` (a ``python ...`` command) in ``cwd`` with its output captured as text, send it ``signum``
    once it has written :data:`READY` in ``cwd``, and return how it ended."""
    run = InBackground(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    pid = _ready_pid(cwd / READY, run, timeout)
    if pid is not None:
        os.kill(pid, signum)
    done = run.result(timeout)
    assert pid is not None, f"the script ended before it was ready: exit code {done.returncode}, {done.stderr[-2000:]}"
    return done


def _ready_pid(path: Path, run: InBackground, timeout: float) -> int | None:
    """The process id the script wrote to ``path``, or None if it ended first."""
    deadline = time.monotonic() + timeout
    while run.running() and time.monotonic() < deadline:
        line = path.read_text() if path.is_file() else ""
        if line.endswith("\n"):
            return int(line)
        time.sleep(0.02)
    assert not run.running(), f"the script never wrote {path.name}"
    return None


@contextmanager
def standard_streams(stdout: int, stderr: int, env: Mapping[str, str]) -> Iterator[None]:
    """This process's standard output and error are the file descriptors ``stdout`` and ``stderr`` inside the
    block: what a warm child started there without capturing its output writes goes to them.  (The warm server
    is started first, with ``env``, so that it keeps the streams it had.)"""
    warm_python.run([sys.executable, "-m", "graphwatch", "--version"], env=env, capture_output=True)
    saved = os.dup(1), os.dup(2)
    try:
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
