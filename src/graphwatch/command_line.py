"""The ``graphwatch`` command line: its options, its ``--help`` texts and exit codes, and where ``run``'s
SCRIPT splits it (what runs each subcommand is :mod:`graphwatch.cli`).

Example::

    >>> args = build_parser().parse_args(["run", "--level", "full", "train.py"])
    >>> args.command, args.level, args.script
    ('run', 'full', 'train.py')
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from .options import LEVELS
from .runner import EXIT_INTERRUPTED, EXIT_SIGTERM
from .version import __version__

EXIT_USAGE = 2  # a user error: nothing ran, or the report could not be written
EXIT_STRICT = 3  # --strict: the script succeeded but leaks a graph
DEFAULT_RUN_OUT = "graphwatch-report"
DEFAULT_DEMO_OUT = "graphwatch-demo"

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

    run = _add(commands, "run", "run an unchanged training script under graphwatch", RUN_DESCRIPTION)
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
    run.add_argument("--trace-only", action="store_true",
                     help="write only DIR/trace.json (under torchrun DIR/rankR/trace.json), no HTML page and no "
                     "pictures; `graphwatch report DIR/trace.json` draws them later")
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

    demo = _add(commands, "demo", "run the bundled bug examples and their fixes; write one report",
                "Runs each bundled example (examples/*_bug.py and its *_fixed.py twin) in its own session, prints "
                "what graphwatch found in each bug and whether each fix is clean, and writes one HTML report. "
                "Exit 1 if a bug went undetected or a fix was not clean.")
    demo.add_argument("--out", metavar="DIR", default=DEFAULT_DEMO_OUT, help=f"report folder (default: {DEFAULT_DEMO_OUT})")
    demo.add_argument("--no-progress", action="store_true", help="no status line while the examples run")

    report = _add(commands, "report", "re-render saved traces (trace.json) into an HTML report",
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


def _add(commands: Any, name: str, summary: str, description: str) -> argparse.ArgumentParser:
    raw = "\n" in description  # written out as it is shown (paragraphs, a table), not filled by argparse
    formatter = argparse.RawDescriptionHelpFormatter if raw else argparse.HelpFormatter
    return commands.add_parser(name, help=summary, description=description, formatter_class=formatter)


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
