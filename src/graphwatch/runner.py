"""Running an unchanged Python script under a graphwatch session (``graphwatch run``, ``graphwatch demo``).

The script runs in this process as ``python SCRIPT ARGS...`` would run it:
``sys.argv`` is ``[SCRIPT, *ARGS]``, it runs as ``__main__``, and its folder
comes first on ``sys.path``.  Steps end at each ``optimizer.step()`` (the
session's default rule), so the script needs no change.  What the script does
is kept: its output and its exit code (``sys.exit(n)`` gives ``n``; an uncaught
exception prints the usual traceback and gives 1; Ctrl-C gives 130; SIGTERM,
with a :class:`SignalGuard`, gives 143).  The session ends whatever
the script does, so the trace is complete up to where the script stopped, and
``trace.ended_early`` says why when it stopped early.

Under ``torchrun`` (``torchrun --nproc-per-node 2 -m graphwatch run --out DIR
train.py``) each rank runs the script in its own session and
:func:`finish_report` writes ``DIR/rank{r}/``; rank 0 alone prints, after
gathering the other ranks' traces into one report (``DIR/index.html``).

Example::

    >>> import pathlib, tempfile
    >>> from graphwatch.runner import run_script
    >>> script = pathlib.Path(tempfile.mkdtemp()) / "train.py"
    >>> _ = script.write_text(
    ...     "import sys, torch\\n"
    ...     "w = torch.ones(2, requires_grad=True)\\n"
    ...     "opt = torch.optim.SGD([w], lr=0.1)\\n"
    ...     "for _ in range(3):\\n"
    ...     "    opt.zero_grad(); (w * w).sum().backward(); opt.step()\\n"
    ...     "sys.exit(int(sys.argv[1]))\\n")
    >>> run = run_script(script, ["4"], session_options={"snapshots": "off"})
    >>> run.exit_code, len(run.trace.steps), run.leaks, run.trace.ended_early
    (4, 3, [], 'SystemExit: 4')
"""

from __future__ import annotations

import io
import os
import runpy
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import (
    ExitStack,
    contextmanager,
    nullcontext,
    redirect_stderr,
    redirect_stdout,
)
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from .analysis import LEAK_KINDS
from .capture.ranks import rank_and_world_size
from .capture.steps.step_limit import StepLimitReached, check_step_limit
from .errors import TraceFormatError, UsageError, without_own_frames
from .model import Finding, Trace
from .session import Session, watch
from .signals import SignalGuard, Terminated

EXIT_ERROR = 1  # an uncaught exception in the script, as with `python SCRIPT`
EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130: Ctrl-C
EXIT_SIGTERM = 128 + signal.SIGTERM  # 143: what a shell reports for a process ended by SIGTERM
RANK_WAIT_SECONDS = 60.0  # how long rank 0 waits for the other ranks' traces when all run on this machine
REMOTE_RANK_WAIT_SECONDS = 5.0  # ... when some run elsewhere (their folders may not be visible from here)
_HIDDEN_FRAMES = frozenset(
    {os.path.normcase(os.path.abspath(__file__)), os.path.normcase(os.path.abspath(runpy.__file__)), "<frozen runpy>"}
)


@dataclass
class ScriptRun:
    """What happened when a script ran under a session."""

    script: Path
    session: Session
    exit_code: int = 0
    error: BaseException | None = None  # the uncaught exception, if any (SystemExit is not one)
    terminated: bool = False  # stopped by SIGTERM
    output: str = ""  # the script's stdout and stderr, when captured

    @property
    def trace(self) -> Trace:
        return self.session.trace

    @property
    def leaks(self) -> list[Finding]:
        """Findings that mean a graph outlives its step (``graphwatch.analysis.LEAK_KINDS``)."""
        return [f for f in self.session.findings if f.kind in LEAK_KINDS]


def check_script(script: str | os.PathLike[str]) -> Path:
    """The script as an absolute path, or a :class:`~graphwatch.UsageError` saying what is wrong with it.

    Example::

        >>> check_script("no/such/train.py")
        Traceback (most recent call last):
        ...
        graphwatch.errors.UsageError: no such script: no/such/train.py; give the path of a Python file, e.g. `graphwatch run train.py`
    """
    path = Path(script)
    if not path.exists():
        raise UsageError(f"no such script: {script}; give the path of a Python file, e.g. `graphwatch run train.py`")
    if path.is_dir() and not (path / "__main__.py").is_file():
        raise UsageError(f"{script} is a folder without __main__.py; give the path of a Python file to run")
    if not os.access(path, os.R_OK):
        raise UsageError(f"cannot read {script}: permission denied; make it readable (chmod +r {script})")
    return path.resolve()


def exit_code_of(exc: SystemExit, stderr: TextIO | None = None) -> int:
    """The exit code Python gives for an uncaught ``SystemExit``; a non-int code is printed, as Python does.

    Example::

        >>> exit_code_of(SystemExit(None)), exit_code_of(SystemExit(3)), exit_code_of(SystemExit(256))
        (0, 3, 0)
    """
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code % 256
    print(code, file=stderr if stderr is not None else sys.stderr)
    return EXIT_ERROR


def print_script_exception(exc: BaseException, file: TextIO | None = None) -> None:
    """Print ``exc`` as Python prints an uncaught exception, without graphwatch's and runpy's frames (the
    user's frames end at their own call into torch, as without graphwatch)."""
    tb = without_own_frames(exc.__traceback__, _HIDDEN_FRAMES)
    traceback.print_exception(type(exc), exc, tb, file=file if file is not None else sys.stderr)


@contextmanager
def script_context(script: Path, args: Sequence[str]) -> Iterator[None]:
    """``sys.argv`` and ``sys.path`` as ``python SCRIPT ARGS`` sets them, restored afterwards.

    Example::

        >>> import sys
        >>> from pathlib import Path
        >>> with script_context(Path("/tmp/train.py"), ["--lr", "0.1"]):
        ...     sys.argv, sys.path[0]
        (['/tmp/train.py', '--lr', '0.1'], '/tmp')
    """
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(script if script.is_dir() else script.parent))
    try:
        yield
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path


def check_out_dir(out: str | os.PathLike[str]) -> Path:
    """``out`` as a Path, created if missing, once a file could be written in it (else :class:`~graphwatch.UsageError`).

    Checked before anything runs, so that a long run never ends with nowhere to write.

    Example::

        >>> import graphwatch
        >>> try:
        ...     check_out_dir("/dev/null/graphwatch-report")
        ... except graphwatch.UsageError as error:
        ...     print(error)
        cannot write the report to /dev/null/graphwatch-report: Not a directory; pass --out a folder you can write
    """
    from .rendering.finding_blocks import printable_path
    from .rendering.report_folder import check_pictures_folder

    path, shown = Path(out), printable_path(out)  # (a newline in the name must not print a line of its own)
    if path.exists() and not path.is_dir():
        raise UsageError(f"cannot write the report to {shown}: it is a file, not a folder; pass --out a folder")
    check_pictures_folder(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise _unwritable(out, exc) from None
    return path


def write_report(
    traces: Trace | list[tuple[str, Trace]], out: Path, headline: tuple[str, bool] | None = None,
    drawn: dict[str, str] | None = None,
) -> Path:
    """Write the HTML report (with trace.json and SVGs) to ``out``; return the index.html path.

    ``drawn``: the pictures already laid out for an earlier report of these traces (DOT source to SVG), as
    :func:`graphwatch.rendering.html.write_report` takes them.
    An OS error while writing becomes a :class:`~graphwatch.UsageError` naming the folder.
    """
    from .rendering.html import write_report as render

    try:
        return Path(render(traces, out, headline, drawn))
    except OSError as exc:
        raise _unwritable(out, exc) from None


def write_trace(trace: Trace, out: Path) -> Path:
    """Write only ``trace``'s trace.json to ``out`` (to ``out/rankR`` under torchrun), no HTML page and no pictures
    (``graphwatch run --trace-only``); return its path.  An OS error becomes a :class:`~graphwatch.UsageError`
    naming the folder."""
    from .model import save_trace
    from .rendering.ranks import rank_folder

    folder = rank_folder(out, trace)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        save_trace(trace, folder / "trace.json")
    except OSError as exc:
        raise _unwritable(folder, exc) from None
    return folder / "trace.json"


def _unwritable(out: str | os.PathLike[str], exc: OSError) -> UsageError:
    """The error for a report folder ``out`` that could not be written, its name on one line."""
    from .rendering.finding_blocks import printable_path

    return UsageError(f"cannot write the report to {printable_path(out)}: {exc.strerror or exc}; "
                      "pass --out a folder you can write")  # fmt: skip


def in_distributed_job() -> bool:
    """True in a process that torchrun (or an initialised torch.distributed) made one of several ranks.

    >>> in_distributed_job()  # a plain ``python`` process
    False
    """
    return (rank_and_world_size()[1] or 1) > 1


def finish_report(
    run: ScriptRun, out: Path, *, summary: bool = True, since: float = 0.0, stop: Callable[[], bool] = lambda: False,
    drawn: dict[str, str] | None = None,
) -> Path:
    """Write this process's report and print the summary; return this process's index.html.  ``drawn``: the
    pictures laid out for this run's reports so far (DOT source to SVG; :func:`write_report`), used and added to.

    One process: the report goes to ``out``.  A rank of a distributed job:
    to ``out/rank{r}``; ranks other than 0 print nothing, and rank 0 waits
    (a bounded time; until ``stop()``) for the other ranks' ``trace.json``
    written since ``since`` (a ``time.time()``), writes one report of all of
    them to ``out/index.html`` and prints their summary, each problem marked
    with the ranks that show it.  ``summary=False`` prints nothing.
    """
    from .rendering.ranks import RankSummary, rank_folder
    from .rendering.terminal import make_console, print_blocks, print_summary

    trace = run.trace
    folder = rank_folder(out, trace)
    drawn = {} if drawn is None else drawn  # (rank 0's pictures, laid out once for its own report and the joint one)
    own = write_report(trace, folder, drawn=drawn)
    if trace.rank:  # rank 1, 2, ...: rank 0 speaks for the job
        return own
    traces = _other_ranks(trace, out, since, stop) if folder != out else []
    if traces:
        combined = write_report([(f"rank {t.rank}", t) for t in [trace, *traces]], out, drawn=drawn)
        if summary:
            console = make_console()
            print_blocks(console, RankSummary([trace, *traces], report=combined).blocks(console.width))
    elif summary:
        print_summary(trace, report=folder)
    return own


def _other_ranks(trace: Trace, out: Path, since: float, stop: Callable[[], bool]) -> list[Trace]:
    """The traces the other ranks of rank 0's job wrote under ``out`` (those that came in time and read well)."""
    from .model import load_trace
    from .rendering.ranks import wait_for_ranks

    world = trace.world_size or 1
    local = os.environ.get("LOCAL_WORLD_SIZE")
    timeout = RANK_WAIT_SECONDS if local is None or int(local) >= world else REMOTE_RANK_WAIT_SECONDS

    def notify(missing: list[int]) -> None:
        ranks = ", ".join(map(str, missing))
        print(f"graphwatch: waiting up to {timeout:.0f} s for the traces of rank(s) {ranks}, to report all ranks "
              "together", file=sys.stderr, flush=True)

    found = wait_for_ranks(out, world, since=since, timeout=timeout, stop=stop, notify=notify)
    traces = []
    for rank, path in found.items():
        if rank == trace.rank:
            continue
        try:
            traces.append(load_trace(path))
        except (TraceFormatError, UsageError) as exc:  # a damaged trace costs its rank's column, not the summary
            print(f"graphwatch: skipping rank {rank}'s trace {path}: {exc}", file=sys.stderr)
    missing = sorted(set(range(world)) - {trace.rank, *(t.rank for t in traces)})
    if missing:
        print(f"graphwatch: no trace from rank(s) {', '.join(map(str, missing))} under {out} in time; "
              "the summary covers the ranks that wrote one", file=sys.stderr)
    return traces


class _StatusLine:
    """A spinner that reads the session's step and finding counts each time rich redraws it."""

    def __init__(self, label: str, session: Session) -> None:
        from rich.spinner import Spinner

        self._label = label
        self._session = session
        self._spinner = Spinner("dots", style="cyan")

    def __rich__(self) -> Any:
        steps = len(self._session.trace.steps)
        found = len(self._session.findings)
        self._spinner.update(
            text=f"graphwatch: {self._label} · step {steps} · {found} finding{'' if found == 1 else 's'}"
        )
        return self._spinner


@contextmanager
def progress_display(label: str, session: Session, console: Any = None) -> Iterator[None]:
    """A transient status line on stderr while the block runs, only when stderr is a terminal.

    Lines the script prints go above the status line (rich's ``Live``
    redirection), so they are never mixed with it; stdout is redirected that
    way only when it is the terminal too (a redirected stdout stays untouched).
    """
    from rich.console import Console
    from rich.live import Live

    console = console if console is not None else Console(stderr=True)
    if not console.is_terminal or console.is_dumb_terminal:
        yield
        return
    stdout_is_tty = bool(getattr(sys.stdout, "isatty", lambda: False)())
    live = Live(
        _StatusLine(label, session),
        console=console,
        transient=True,
        refresh_per_second=8,
        redirect_stdout=stdout_is_tty,
        redirect_stderr=True,
    )
    with live:
        yield


def run_script(
    script: str | os.PathLike[str],
    args: Sequence[str] = (),
    *,
    session_options: Mapping[str, Any] | None = None,
    progress: str | None = None,
    guard: SignalGuard | None = None,
    capture_output: bool = False,
    stop_after: int | None = None,
) -> ScriptRun:
    """Run ``script`` with ``args`` in this process inside a new session; the script's errors are returned, not raised.

    ``session_options`` go to :func:`graphwatch.watch` (``summary`` defaults to
    False here).  ``progress``: a label for :func:`progress_display`, or None
    for no status line.  ``guard``: an entered :class:`SignalGuard`, armed
    while the script runs.  ``capture_output``: keep the script's Python-level
    stdout and stderr in ``ScriptRun.output`` instead of printing them.
    ``stop_after``: end the script after that many steps (exit code 0; the
    trace says where it stopped).  The trace also records what trained
    (:class:`~graphwatch.capture.causes.parameters.ParameterLedger`).  Raises
    :class:`~graphwatch.UsageError` (before running anything) for a missing
    script or a bad option.
    """
    path = check_script(script)
    session = watch(**{"summary": False, **(session_options or {})})
    session.stop_after = check_step_limit(stop_after)
    run = ScriptRun(path, session)
    buffer = io.StringIO()
    caught: BaseException | None = None
    ledger = session.ledger
    with script_context(path, args):
        session.__enter__()
        try:
            with ExitStack() as stack:
                if progress is not None:
                    stack.enter_context(progress_display(progress, session))
                if capture_output:
                    stack.enter_context(redirect_stdout(buffer))
                    stack.enter_context(redirect_stderr(buffer))
                stack.enter_context(guard.armed() if guard is not None else nullcontext())
                session.script_globals = runpy.run_path(str(path), run_name="__main__")
            if stop_after is not None:  # a rerun that checks a fix: optimizers that never stepped count too
                ledger.find_unstepped()
        except StepLimitReached as exc:  # stopped as asked: a normal end, named in the trace
            ledger.find_unstepped(exc.__traceback__)
            caught = exc
        except SystemExit as exc:
            run.exit_code = exit_code_of(exc, stderr=buffer if capture_output else None)
            caught = exc if run.exit_code else None  # sys.exit(0) is a normal end
        except BaseException as exc:  # the script's own failure, reported as Python would
            caught = run.error = exc
        finally:
            session.__exit__(type(caught) if caught else None, caught, caught.__traceback__ if caught else None)
    run.output = buffer.getvalue()
    if isinstance(caught, StepLimitReached):
        run.trace.ended_early = str(caught)
    run.terminated = isinstance(run.error, Terminated) or (guard is not None and guard.terminated)
    if run.terminated:
        run.exit_code = EXIT_SIGTERM
        run.trace.ended_early = run.trace.ended_early or "Terminated: received SIGTERM"
    elif isinstance(run.error, KeyboardInterrupt):
        run.exit_code = EXIT_INTERRUPTED
    elif run.error is not None:
        run.exit_code = EXIT_ERROR
    return run
