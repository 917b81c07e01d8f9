"""The ``graphwatch`` command (also ``python -m graphwatch``).

Subcommands::

    graphwatch run [--out DIR] [--strict] [--patch-out FILE] [--quiet] [--check-fixes] [--stop-after N] SCRIPT [ARGS...]
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
from typing import Any, TextIO

from . import __version__
from .errors import TraceFormatError, UsageError
from .model.trace_io import save_trace_elsewhere
from .options import LEVELS
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
)
from .signals import SignalGuard, ignore_signal

EXIT_USAGE = 2  # a user error: nothing ran, or the report could not be written
EXIT_STRICT = 3  # --strict: the script succeeded but leaks a graph
DEFAULT_RUN_OUT = "graphwatch-report"
DEFAULT_DEMO_OUT = "graphwatch-demo"


def error(message: str) -> int:
    """Print ``graphwatch: error: MESSAGE`` on stderr; return the usage-error exit code."""
    say(f"graphwatch: error: {message}")
    return EXIT_USAGE


def say(text: str, file: TextIO | None = None) -> None:
    """Print a line (on stderr unless ``file``) that no string in it can turn into terminal commands
    (:func:`~graphwatch.rendering.terminal.printable`), in whatever the stream can encode; a reader that has
    gone (a closed pipe) ends the printing, never the command."""
    from .rendering.terminal import printable, silence_broken_pipe

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
        if args.check_fixes and not (guard.terminated or guard.interrupted or run.terminated):
            checks_stopped = _check_fixes(run, args, out, since, guard)
        report, failure = _write_report(run, out, args.quiet, since, lambda: guard.terminated)
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


def _check_fixes(run: ScriptRun, args: argparse.Namespace, out: Path, since: float, guard: SignalGuard) -> bool:
    """``--check-fixes``: each patch applied to a copy of the folder and run again (:mod:`graphwatch.fix_checks`).

    The report is written before the first check and again after each verdict.  SIGTERM or Ctrl-C ends the
    checks (True is returned): the patched run and its processes are killed and the scratch folder removed.
    """
    from .fix_checks import CheckStopped, check_fixes, check_timeout

    def say(line: str) -> None:
        print(f"graphwatch: {line}", file=sys.stderr, flush=True)

    def write() -> None:
        try:
            write_report(run.trace, out)
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
    return False


def _write_report(
    run: ScriptRun, out: Path, quiet: bool, since: float, stop: Callable[[], bool]
) -> tuple[Path | None, str | None]:
    """Write the report and print the summary: (index.html, None), or (None, why) with the summary still printed
    and the trace saved to a temporary file (named in ``why``) instead."""
    try:
        return finish_report(run, out, summary=not quiet, since=since, stop=stop), None
    except UsageError as exc:
        if not quiet and not run.trace.rank:
            from .rendering.terminal import print_summary

            print_summary(run.trace, report=None)
        kept = save_trace_elsewhere(run.trace)
        if kept is None:
            return None, f"{exc}; the report could not be written (the summary above is all there is)"
        return None, f"{exc}; the report could not be written; the trace was saved to {kept} (graphwatch report {kept} --out DIR)"


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
    from .rendering.terminal import printable_path

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
    from .rendering.ranks import RankSummary, is_rank_set
    from .rendering.terminal import Summary, make_console, print_blocks, printable_path

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


# --------------------------------------------------------------- parser
# `graphwatch run`'s exit codes, as its --help lists them
RUN_EXIT_CODES = (
    ("the script's own", "0 when it ends normally, or its sys.exit(n)"),
    ("1", "an uncaught exception in the script (with the usual traceback)"),
    (str(EXIT_USAGE), "a missing script, or an unwritable DIR or FILE, at the start; at the end, a report (or FILE)\n"
                      "that could not be written, when the script itself succeeded"),
    (str(EXIT_STRICT), "--strict: the script succeeded, but graphwatch found a leak"),
    (str(EXIT_INTERRUPTED), "Ctrl-C (SIGINT): the report so far is written, marked as ended early"),
    (str(EXIT_SIGTERM), "SIGTERM: likewise"),
)
RUN_DESCRIPTION = """\
Runs SCRIPT as `python SCRIPT ARGS...` would, in the same process, inside a graphwatch session. The
script's own output and exit code are kept; the summary goes to stderr (each patch outside any box, so
that it can be copied, or the output piped, into `patch -p0`) and the HTML report to DIR.

How steps are counted: a step is one pass of the script's training loop. It ends where the script says
so (each `with gw.step():` block, each call of an `@graphwatch.step` function); otherwise after the last
training event of the loop's body, a backward() outside optimizer.step() or an optimizer.step().
graphwatch reads the source of the function that runs them: the training loop is the innermost loop
that holds all of them, so a GAN's D and G updates are one step, and so are the micro-batches of
gradient accumulation with their optimizer.step(); a loop with no optimizer gets one step per
iteration. Without source (code built by exec), each optimizer.step() ends a step.

Under torchrun each rank writes DIR/rankR/; rank 0 prints the summary of all ranks and writes their
joint report to DIR/index.html.

exit codes:
""" + "".join(
    f"  {code:<18}{meaning.replace(chr(10), chr(10) + ' ' * 20)}\n" for code, meaning in RUN_EXIT_CODES
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``graphwatch`` command, with its three subcommands."""
    parser = argparse.ArgumentParser(
        prog="graphwatch",
        description="Watch the lifecycle of PyTorch autograd graphs: graphs kept across steps, retained graphs "
        "never freed, backward through a freed graph.",
        epilog="Run `graphwatch COMMAND --help` for each command's options.",
    )
    parser.add_argument("--version", action="version", version=version_text())
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = _add(commands, "run", cmd_run, "run an unchanged training script under graphwatch", RUN_DESCRIPTION)
    run.add_argument("--out", metavar="DIR", default=DEFAULT_RUN_OUT, help=f"report folder (default: {DEFAULT_RUN_OUT})")
    run.add_argument(
        "--strict", action="store_true", help=f"exit {EXIT_STRICT} when graphwatch finds a leak, even if the script succeeded"
    )
    run.add_argument("--patch-out", metavar="FILE",
                     help="also write every patch to FILE, one file that `patch -p0 < FILE` applies from the folder "
                     "the script ran in (it is written with --quiet too)")
    run.add_argument("--quiet", "-q", action="store_true",
                     help="print no summary and no progress (errors only; the patches still go to --patch-out FILE)")
    run.add_argument("--no-progress", action="store_true", help="no status line while the script runs")
    run.add_argument(
        "--check-fixes", action="store_true",
        help="after the run, apply each finding's patch to a copy of the script's folder and run the script again "
        "for the steps the finding needs: a patch is 'checked' when it applies, the finding is gone, nothing new "
        "goes wrong and every parameter still gets gradients from the same optimizer. It copies regular files "
        "only, never secrets (.env*, .ssh, *.pem, ...), and refuses to run from / or a home folder, or when an "
        "argument or environment variable names a path outside the folder (see --check-allow-path). A patched run "
        "may take 5 times the run, at least 300 s ($GRAPHWATCH_CHECK_TIMEOUT seconds instead, meant for tests)",
    )  # fmt: skip
    run.add_argument(
        "--check-allow-path", metavar="PATH", action="append", default=[],
        help="with --check-fixes: let the patched run name PATH (and what is under it) outside the copied folder, "
        "in its arguments or environment variables; it may write there (repeatable)",
    )  # fmt: skip
    run.add_argument(
        "--stop-after", metavar="N", type=_positive_int, default=None,
        help="end the script cleanly after N steps (at the next backward or optimizer step; exit code 0, the "
        "report says where it stopped)",
    )  # fmt: skip
    run.add_argument(
        "--level",
        choices=LEVELS,
        default="default",
        help="what to record (default: %(default)s; 'light': backward calls and steps only)",
    )
    run.add_argument("script", metavar="SCRIPT", help="the Python script to run")
    run.add_argument("args", metavar="ARGS", nargs="*", default=[], help="arguments for the script, passed on as they are (`--` too)")

    demo = _add(commands, "demo", cmd_demo, "run the bundled bug examples and their fixes; write one report",
                "Runs each bundled example (examples/*_bug.py and its *_fixed.py twin) in its own session, prints "
                "what graphwatch found in each bug and whether each fix is clean, and writes one HTML report. "
                "Exit 1 if a bug went undetected or a fix was not clean.")
    demo.add_argument("--out", metavar="DIR", default=DEFAULT_DEMO_OUT, help=f"report folder (default: {DEFAULT_DEMO_OUT})")
    demo.add_argument("--no-progress", action="store_true", help="no status line while the examples run")

    report = _add(commands, "report", cmd_report, "re-render saved traces (trace.json) into an HTML report",
                  "Reads traces written by gw.save(path) or a report's trace.json and writes the HTML report again; "
                  "several traces go into one report. The traces of the ranks of one torchrun job (DIR/rank*/trace.json) "
                  "get a section across ranks, and findings seen on only some ranks are marked.")
    report.add_argument("traces", metavar="TRACE.json", nargs="+", help="trace file(s) to render")
    report.add_argument("--out", metavar="DIR", default=DEFAULT_RUN_OUT, help=f"report folder (default: {DEFAULT_RUN_OUT})")
    report.add_argument("--quiet", "-q", action="store_true", help="print only where the report is")
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of steps (a whole number, at least 1)")
    return value


def _add(
    commands: Any, name: str, handler: Callable[[argparse.Namespace], int], summary: str, description: str
) -> argparse.ArgumentParser:
    raw = "\n" in description  # written out as it is shown (paragraphs, a table), not filled by argparse
    formatter = argparse.RawDescriptionHelpFormatter if raw else argparse.HelpFormatter
    sub = commands.add_parser(name, help=summary, description=description, formatter_class=formatter)
    sub.set_defaults(handler=handler)
    return sub


def version_text() -> str:
    """``graphwatch X.Y.Z (torch A.B.C, Python D.E.F)``."""
    import platform

    import torch

    return f"graphwatch {__version__} (torch {torch.__version__}, Python {platform.python_version()})"


# Options of `graphwatch run` followed by a value (checked against the parser by the tests).
RUN_VALUE_OPTIONS = frozenset({"--out", "--level", "--patch-out", "--stop-after", "--check-allow-path"})


def split_script_args(argv: Sequence[str]) -> tuple[list[str], list[str] | None]:
    """Split a command line at ``run``'s SCRIPT: (what graphwatch parses, the script's arguments verbatim).

    argparse would drop a ``--`` meant for the script; ``python SCRIPT ARGS`` keeps it, and so does this.
    The second item is None when the command is not ``run``.

    Example::

        >>> split_script_args(["run", "--out", "r", "train.py", "--", "--lr", "1"])
        (['run', '--out', 'r', 'train.py'], ['--', '--lr', '1'])
        >>> split_script_args(["report", "trace.json"])
        (['report', 'trace.json'], None)
    """
    argv = list(argv)
    command = next((i for i, token in enumerate(argv) if not token.startswith("-")), None)
    if command is None or argv[command] != "run":
        return argv, None
    i = command + 1
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return argv[: i + 2], argv[i + 2 :]
        if not token.startswith("-"):
            return argv[: i + 1], argv[i + 1 :]
        i += 2 if token in RUN_VALUE_OPTIONS else 1
    return argv, []


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
        return int(args.handler(args))
    except (UsageError, TraceFormatError) as exc:
        return error(str(exc))
    except KeyboardInterrupt:
        say("graphwatch: interrupted")
        return EXIT_INTERRUPTED
    finally:
        flush_streams()
