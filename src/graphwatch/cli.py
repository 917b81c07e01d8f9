"""The ``graphwatch`` command (also ``python -m graphwatch``).

Subcommands::

    graphwatch run [--out DIR] [--strict] [--patch-out FILE] [--quiet] [--trace-only] [--check-fixes] [--stop-after N]
                   SCRIPT [ARGS...]
                                                                        watch an unchanged training script
    graphwatch demo [--out DIR]                                         the bundled bug examples, one report
    graphwatch report TRACE.json [TRACE2.json ...] [--out DIR]          re-render saved traces

Under ``torchrun --nproc-per-node N -m graphwatch run --out DIR train.py`` each
rank writes ``DIR/rank{r}/`` and keeps its own exit code; rank 0 prints the
summary of all ranks and writes their joint report to ``DIR/index.html``.
``graphwatch report DIR/rank*/trace.json`` joins rank traces again: a column
per rank, and findings marked when only some ranks show them.

Exit codes of ``graphwatch run``: the script's own (0, ``sys.exit(n)``, 1 for
an uncaught exception, 130 for Ctrl-C); 143 when stopped by SIGTERM (the
report is still written and says the run ended early); 3 with ``--strict``
when the script succeeded but graphwatch found a leak (a kind in
``graphwatch.analysis.LEAK_KINDS``).  Every subcommand exits 2 with a one-line
``graphwatch: error: ...`` for a user error (missing script, unreadable or
foreign trace, unwritable output folder, bad option).

Example::

    >>> from graphwatch.cli import main
    >>> main(["report", "no-such-trace.json"])  # doctest: +SKIP
    graphwatch: error: no-such-trace.json does not exist; pass the trace.json a session wrote
    2
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

from .command_line import EXIT_STRICT, EXIT_USAGE, build_parser, split_script_args
from .errors import TraceFormatError, UsageError
from .model.trace_io import save_trace_elsewhere
from .patch_out import check_patch_out, write_patches
from .runner import (
    EXIT_INTERRUPTED,
    EXIT_SIGTERM,
    ScriptRun,
    check_out_dir,
    finish_report,
    in_distributed_job,
    print_script_exception,
    run_script,
    write_report,
    write_trace,
)
from .signals import SignalGuard, ignore_signal
from .warm_start import start_zygote, stop_zygote


def error(message: str) -> int:
    """Print ``graphwatch: error: MESSAGE`` on stderr; return the usage-error exit code."""
    say(f"graphwatch: error: {message}")
    return EXIT_USAGE


def say(text: str, file: TextIO | None = None) -> None:
    """Print a line (on stderr unless ``file``) that no string in it can turn into terminal commands
    (:func:`~graphwatch.rendering.finding_blocks.printable`), in whatever the stream can encode; a reader that has
    gone (a closed pipe) ends the printing, never the command."""
    from .rendering.finding_blocks import printable
    from .rendering.terminal import silence_broken_pipe

    stream = sys.stderr if file is None else file
    if stream is None:  # started with the stream closed
        return
    line = printable(text)
    try:
        line.encode(stream.encoding or "utf-8")
    except (UnicodeEncodeError, LookupError):
        line = line.encode("ascii", "backslashreplace").decode("ascii")
    try:
        print(line, file=stream, flush=True)
    except BrokenPipeError:
        silence_broken_pipe(stream)


def flush_streams() -> None:
    """Flush stdout and stderr; one whose reader has gone is pointed at /dev/null (Python's own last flush
    would otherwise fail, with exit status 120)."""
    from .rendering.terminal import silence_broken_pipe

    for stream in (sys.stdout, sys.stderr):
        if stream is None:
            continue
        try:
            stream.flush()
        except BrokenPipeError:
            silence_broken_pipe(stream)
        except (OSError, ValueError):  # closed
            pass


# ------------------------------------------------------------------ run
def cmd_run(args: argparse.Namespace) -> int:
    """``graphwatch run``: the script's exit code, 143 after SIGTERM, or 3 for --strict leaks (per rank under torchrun).

    Only the process that started the run writes the report: a child the
    script forked, exiting through the same code, just exits.  A report that
    cannot be written at the end costs exit 2 only when the script succeeded;
    the summary is printed either way.
    """
    since = time.time()
    if args.check_fixes and in_distributed_job():
        raise UsageError("--check-fixes runs the script again in one process; run it without torchrun")
    patch_out = check_patch_out(args.patch_out, args.script) if args.patch_out else None  # (before out is made)
    out = check_out_dir(args.out).absolute()  # before the script can os.chdir
    if args.check_fixes:
        _check_fixes_may_run(args, out)
        start_zygote()  # before the script runs: the patched runs fork off it (graphwatch.warm_start)
    options = {"level": args.level}
    show_progress = not (args.quiet or args.no_progress or in_distributed_job())  # ranks share one terminal
    started_in = os.getpid()
    with SignalGuard() as guard:
        run = run_script(
            args.script, args.args, session_options=options, guard=guard,
            progress=Path(args.script).name if show_progress else None, stop_after=args.stop_after,
        )
        if os.getpid() != started_in:  # a forked child of the script: its parent writes the report
            return run.exit_code
        if run.error is not None and not run.terminated:
            try:
                print_script_exception(run.error)
            except BrokenPipeError:  # stderr's reader has gone: the exit code still says it failed
                flush_streams()
        flush_streams()  # the script's output first (and a closed pipe found before the summary)
        checks_stopped = False
        drawn: dict[str, str] = {}  # the pictures laid out so far: each report written again reuses them
        if args.check_fixes and not (guard.terminated or guard.interrupted or run.terminated):
            checks_stopped = _check_fixes(run, args, out, since, guard, drawn)
        report, failure = _write_report(run, out, args.quiet, since, lambda: guard.terminated, drawn, args.trace_only)
        code = _run_exit_code(run, guard, failure, args.strict)
        if checks_stopped and not guard.terminated:  # Ctrl-C during the checks ends the command as Ctrl-C does
            code = EXIT_INTERRUPTED
        if patch_out is not None and not run.trace.rank:
            try:
                write_patches(run.trace, patch_out, run.script, args.quiet)
            except UsageError as exc:  # said, and costs exit 2 only when the script succeeded (as a report would)
                error(str(exc))
                code = code or EXIT_USAGE
    _say_how_it_ended(run, guard, report, failure, code)
    if code == EXIT_SIGTERM and hasattr(signal, "SIGCHLD"):
        # Killed by SIGTERM, bare Python would run no finalizer: a DataLoader's, run at exit, would find its
        # workers killed by the same signal and its SIGCHLD handler would raise inside __del__.
        signal.signal(signal.SIGCHLD, ignore_signal)
    return code


def _check_fixes_may_run(args: argparse.Namespace, out: Path) -> None:
    """Before the script runs: a UsageError when ``--check-fixes`` must not copy the folder or could let the
    patched run write outside it (:func:`graphwatch.fix_checks.refusal`)."""
    from .fix_checks import refusal
    from .runner import check_script

    why = refusal(check_script(args.script), Path.cwd(), args.args, os.environ, args.check_allow_path, out)
    if why:
        raise UsageError(f"--check-fixes: {why}")


def _check_fixes(
    run: ScriptRun, args: argparse.Namespace, out: Path, since: float, guard: SignalGuard, drawn: dict[str, str]
) -> bool:
    """``--check-fixes``: each patch applied to a copy of the folder and run again (:mod:`graphwatch.fix_checks`).

    The report is written before the first check and again after each verdict, its pictures laid out once
    (``drawn``: DOT source to SVG, kept for the report written at the end).  SIGTERM or Ctrl-C ends the
    checks (True is returned): the patched run and its processes are killed and the scratch folder removed.
    """
    from .fix_checks import CheckStopped, check_fixes, check_timeout

    def say(line: str) -> None:
        print(f"graphwatch: {line}", file=sys.stderr, flush=True)

    def write() -> None:
        try:
            if args.trace_only:
                _write_trace(run, out, summary=False)
            else:
                write_report(run.trace, out, drawn=drawn)
        except UsageError:  # said once, when the report is written at the end
            pass

    timeout = check_timeout(time.time() - since)
    write()
    try:
        check_fixes(run.trace, run.script, args.args, report=out, timeout=timeout, say=None if args.quiet else say,
                    allowed=args.check_allow_path, stop=lambda: guard.terminated or guard.interrupted,
                    on_verdict=write)  # fmt: skip
    except CheckStopped:
        done = sum(1 for f in run.trace.findings if f.check is not None)
        why = "SIGTERM" if guard.terminated else "Ctrl-C"
        say(f"--check-fixes stopped by {why}; the report holds the verdicts of the {done} finding(s) checked so far")
        return True
    finally:
        stop_zygote()
    return False


def _write_report(
    run: ScriptRun, out: Path, quiet: bool, since: float, stop: Callable[[], bool], drawn: dict[str, str],
    trace_only: bool = False,
) -> tuple[Path | None, str | None]:  # fmt: skip
    """Write the report (only its trace.json with ``trace_only``) and print the summary: (index.html or
    trace.json, None), or (None, why) with the summary still printed and the trace saved to a temporary file
    (named in ``why``) instead."""
    try:
        if trace_only:
            return _write_trace(run, out, summary=not quiet), None
        return finish_report(run, out, summary=not quiet, since=since, stop=stop, drawn=drawn), None
    except UsageError as exc:
        if not quiet and not run.trace.rank:
            from .rendering.terminal import print_summary

            print_summary(run.trace, report=None)
        kept = save_trace_elsewhere(run.trace)
        if kept is None:
            return None, f"{exc}; the report could not be written (the summary above is all there is)"
        return None, f"{exc}; the report could not be written; the trace was saved to {kept} (graphwatch report {kept} --out DIR)"


def _write_trace(run: ScriptRun, out: Path, summary: bool) -> Path:
    """``--trace-only``: write this process's trace.json (:func:`~graphwatch.runner.write_trace`); with
    ``summary``, print the summary (rank 0's own) and where the trace is.  Returns its path."""
    from .rendering.finding_blocks import printable_path
    from .rendering.terminal import print_summary

    path = write_trace(run.trace, out)
    if summary and not run.trace.rank:
        print_summary(run.trace)
        say(f"trace: {printable_path(path)} (graphwatch report TRACE.json --out DIR draws its report)")
    return path


def _run_exit_code(run: ScriptRun, guard: SignalGuard, failure: str | None, strict: bool) -> int:
    """The script's own non-zero code wins (143 after SIGTERM, 130 after Ctrl-C); then 2 for a report that
    could not be written; then 3 for --strict leaks."""
    if guard.terminated or run.terminated:
        return EXIT_SIGTERM
    if run.exit_code:
        return run.exit_code
    if guard.interrupted:
        return EXIT_INTERRUPTED
    if failure is not None:
        return EXIT_USAGE
    return EXIT_STRICT if strict and run.leaks else 0


def _say_how_it_ended(run: ScriptRun, guard: SignalGuard, report: Path | None, failure: str | None, code: int) -> None:
    """One line on stderr for each way the run did not simply end: no report, a signal, --strict leaks."""
    from .rendering.finding_blocks import printable_path

    if failure is not None:
        error(failure)
    if code == EXIT_SIGTERM:
        where = "no report was written" if report is None else (
            f"the report (marked as ended early) is at {printable_path(report)}" if run.trace.ended_early
            else f"it came after the script had ended; the report is complete: {printable_path(report)}"
        )
        say(f"graphwatch: stopped by SIGTERM; {where}")
    elif guard.interrupted and not run.exit_code:
        say(f"graphwatch: interrupted while the report was written; it was finished first: {printable_path(str(report))}")
    elif code == EXIT_STRICT and not run.exit_code:
        kinds = ", ".join(sorted({f.kind for f in run.leaks}))
        say(f"graphwatch: --strict: {len(run.leaks)} leak finding(s) ({kinds}); exit {EXIT_STRICT}")


# --------------------------------------------------------------- report
def cmd_report(args: argparse.Namespace) -> int:
    """``graphwatch report``: re-render one or more saved traces into one report."""
    from . import load
    from .rendering.finding_blocks import printable_path
    from .rendering.ranks import RankSummary, is_rank_set
    from .rendering.terminal import Summary, make_console, print_blocks

    loaded = [(label, load(path)) for label, path in zip(trace_labels(args.traces), args.traces)]
    ranks = is_rank_set([trace for _, trace in loaded])
    if ranks:  # the ranks of one distributed job: one column each, in rank order
        loaded = sorted(((f"rank {t.rank}", t) for _, t in loaded), key=lambda section: section[1].rank or 0)
    out = check_out_dir(args.out)
    report = write_report(loaded[0][1] if len(loaded) == 1 else loaded, out)
    if not args.quiet:
        console = make_console(sys.stdout)
        if ranks:
            print_blocks(console, RankSummary([trace for _, trace in loaded]).blocks(console.width))
        else:
            for label, trace in loaded:
                print_blocks(console, Summary(trace, title=label if len(loaded) > 1 else None).blocks(console.width))
    say(f"report: {printable_path(report)}", sys.stdout)
    return 0


def trace_labels(paths: Sequence[str]) -> list[str]:
    """Names for trace files in a combined report: each file's stem, or its folder's name for ``.../trace.json``.

    Example::

        >>> trace_labels(["runs/lstm/trace.json", "baseline.json", "old/baseline.json"])
        ['lstm', 'baseline', 'baseline (2)']
    """
    labels: list[str] = []
    for name in paths:
        path = Path(name)
        label = path.resolve().parent.name if path.stem == "trace" and path.resolve().parent.name else path.stem
        count = sum(1 for seen in labels if seen == label or seen.startswith(f"{label} ("))
        labels.append(f"{label} ({count + 1})" if count else label)
    return labels


# ----------------------------------------------------------------- demo
def cmd_demo(args: argparse.Namespace) -> int:
    """``graphwatch demo``: see :func:`graphwatch.demo.run_demo`."""
    from .demo import run_demo

    return run_demo(check_out_dir(args.out), progress=not args.no_progress)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"run": cmd_run, "demo": cmd_demo, "report": cmd_report}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``graphwatch`` console script; returns the process exit code."""
    parser = build_parser()
    own, script_args = split_script_args(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(own)
    if script_args is not None:
        args.args = script_args
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return COMMANDS[args.command](args)
    except (UsageError, TraceFormatError) as exc:
        return error(str(exc))
    except KeyboardInterrupt:
        say("graphwatch: interrupted")
        return EXIT_INTERRUPTED
    finally:
        flush_streams()
