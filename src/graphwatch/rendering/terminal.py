"""The terminal summary: a verdict, the findings with their lines, a per-step table and sparklines.

:class:`Summary` is a rich renderable, so it composes with other rich output
(a ``Panel``, a ``Group``, a live display); :func:`print_summary` prints one to
the standard error stream, which keeps a training script's own standard output
clean.  The console it makes writes plain text (no ANSI codes) when stderr is
not a terminal or the ``NO_COLOR`` environment variable is set.

What a summary says (the verdict, which steps, why a run ended early) is
decided in :mod:`graphwatch.rendering.wording`, shared with the HTML report.

Example::

    >>> import io
    >>> from rich.console import Console
    >>> from graphwatch.model import StepRecord, Trace
    >>> console = Console(file=io.StringIO(), width=100)
    >>> console.print(Summary(Trace(steps=[StepRecord(index=0, source="optimizer")])))
    >>> console.file.getvalue().splitlines()[0]
    'graphwatch: no graph leaks in 1 step'
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, cast

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.panel import Panel
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from ..analysis.evidence import counted, human_bytes
from ..analysis.growth import live_counts_measured, measured_values
from ..model import Trace
from .charts import SPARK_ASCII, SPARK_BLOCKS, range_text, sparkline
from .finding_blocks import Verbatim, findings_lines, numbered_patches, patch_blocks, printable, printable_path
from .wording import (
    averaged_text,
    counted_only_text,
    detail_text,
    ending_text,
    explained_in_error,
    marked_steps,
    nothing_watched_text,
    sample_steps,
    seconds_text,
    step_values,
    time_text,
    verdict,
)

# one ASCII character for each non-ASCII one the summary draws, so columns stay aligned
_ASCII = str.maketrans(
    dict(zip(SPARK_BLOCKS, SPARK_ASCII))
    | {"–": "-", "…": ".", "→": ">", "·": "/", "⋯": ":", "✖": "x", "▲": "!", "●": "*", "²": "2"}
)


# ------------------------------------------------------------------------- rich output
# ------------------------------------------------------------------------- rich output
class _Blocks:
    """Some of a summary's blocks as one renderable, ASCII on a console that cannot show unicode."""

    def __init__(self, parts: Sequence[RenderableType]) -> None:
        self.parts = parts

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from ascii_safe(console, options, self.parts)


def print_blocks(console: Console, blocks: Sequence[RenderableType]) -> None:
    """Print ``blocks`` in order: each :class:`Verbatim` one straight to the console's stream (past rich, and
    past the trimming of :class:`TrimmedLines`), the others through rich."""
    pending: list[RenderableType] = []
    for block in [*blocks, None]:
        if block is not None and not isinstance(block, Verbatim):
            pending.append(block)
            continue
        if pending:
            console.print(_Blocks(pending))
            pending = []
        if block is None:
            break
        stream = console.file
        stream = stream.file if isinstance(stream, TrimmedLines) else stream
        stream.flush()
        try:
            stream.write(block.text)
        except UnicodeEncodeError:  # a stream that cannot show a character of the user's source
            stream.write(block.text.encode("ascii", "backslashreplace").decode("ascii"))
        stream.flush()


def ascii_safe(console: Console, options: ConsoleOptions, parts: Sequence[RenderableType]) -> RenderResult:
    """Render ``parts`` with no control character left in their text (whatever escaped :func:`printable` is
    made visible here); on a console that cannot encode unicode, as ASCII (rich already draws boxes in ASCII
    there)."""
    for segment in console.render(Group(*parts), options):
        text = segment.text if segment.control else printable(segment.text)
        if options.ascii_only:
            text = text.translate(_ASCII).encode("ascii", "replace").decode("ascii")
        yield Segment(text, segment.style, segment.control)


class Summary:
    """A rich renderable: the summary of one trace.

    ``report`` is where a report was written (its folder or its index.html), if one was.

    ``title`` names the run (e.g. an example's name or a rank) on the verdict line.
    """

    def __init__(self, trace: Trace, report: Path | None = None, title: str | None = None) -> None:
        self.trace = trace
        self.report = report
        self.title = title

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from ascii_safe(console, options, self.blocks(options.max_width))

    def blocks(self, max_width: int) -> list[RenderableType]:
        """The summary's parts in order, for a console ``max_width`` wide; its patches are :class:`Verbatim`
        blocks, printed below the findings and outside their box (see :func:`print_blocks`)."""
        boxed = max_width < UNWRAPPED_WIDTH  # unwrapped output (no terminal): no box as wide as the log
        return list(self._parts(max_width, boxed))

    def _parts(self, max_width: int, boxed: bool = True) -> Iterator[RenderableType]:
        trace = self.trace
        text, good = verdict([trace])
        line = Text(text, style="bold green" if good else "bold red")
        one_of_ranks = self.title is None and (trace.world_size or 1) > 1
        title = f"rank {trace.rank} of {trace.world_size}" if one_of_ranks else self.title
        if title:
            line.append(f"  ({printable(title)})", style="dim")
        yield line
        if one_of_ranks:
            yield Text(other_ranks_hint(self.report), style="dim")
        ending = ending_text(trace)
        if ending:
            yield Text(printable(ending), style="yellow")
        if trace.untracked_saved:
            yield Text(
                f"{counted(trace.untracked_saved, 'saved tensor')} went through hooks graphwatch cannot see "
                "(saved_tensors_hooks entered inside the session); they are not counted",
                style="dim",
            )
        for notice in (nothing_watched_text(trace), detail_text(trace), averaged_text(trace), counted_only_text(trace)):
            if notice:
                yield Text(notice, style="dim")
        patches = numbered_patches(trace.findings, self._cwd)
        if trace.findings and boxed:
            yield Panel(
                Group(*self._findings(patches)),
                title="findings",
                title_align="left",
                border_style="red" if not good else "blue",
            )
        elif trace.findings:
            yield Text("findings", style="bold")
            yield from self._findings(patches)
        yield from patch_blocks(trace.findings, patches)
        if trace.steps:
            yield self._table()
            yield self._sparklines(max_width)
        if time_text(trace):
            yield Text(time_text(trace), style="dim")
        if self.report is not None:
            index = Path(self.report)
            yield Text.assemble(("report: ", "bold"), printable_path(index if index.suffix == ".html" else index / "index.html"))

    def _findings(self, patches: Mapping[str, int]) -> Iterator[RenderableType]:
        yield from findings_lines(
            self.trace.findings, lambda finding: explained_in_error(self.trace, finding), patches, self._cwd
        )

    @property
    def _cwd(self) -> str | None:
        cwd = self.trace.options.get("cwd")
        return str(cwd) if cwd else None

    def _table(self) -> Table:
        steps = self.trace.steps
        marks = marked_steps(self.trace)
        rows = sample_steps(steps, marks)
        shown = sum(1 for r in rows if not isinstance(r, int))
        table = Table(
            box=box.SIMPLE_HEAD,
            title="per step",
            title_justify="left",
            caption=None if shown == len(steps) else f"{shown} of {len(steps)} steps shown: "
            + ("the first, the last, and each step where a finding was first seen" if marks else "the first and the last"),
            caption_justify="left",
        )
        cpu = bool(self.trace.seconds)  # recorded (a trace of an older graphwatch has no CPU times)
        names = ("step", "nodes\nmade", "backward\nwall clock", *(("backward\nCPU",) * cpu), "live\nsaved", "nodes\nalive")
        for name in names:
            table.add_column(name, justify="right", no_wrap=True)
        table.add_column("first seen", style="red", overflow="fold")
        measured = live_counts_measured(self.trace)  # (a step seen light measured no live count, no CPU time: "–")
        for row in rows:
            if isinstance(row, int):
                table.add_row("⋯", *[""] * (len(names) - 1), f"{counted(row, 'step')} omitted", style="dim")
                continue
            backward = f"{len(row.backwards)} · {seconds_text(row.backward_seconds)}" if row.backwards else "–"
            backward_cpu = seconds_text(row.backward_cpu_seconds) if row.backwards and measured(row.index) else "–"
            table.add_row(
                str(row.index),
                f"{row.nodes_created:,}",
                backward,
                *((backward_cpu,) * cpu),
                human_bytes(row.live_saved_bytes) if measured(row.index) else "–",
                f"{row.live_nodes:,}" if measured(row.index) else "–",
                printable(marks.get(row.index, "")),
            )
        return table

    def _sparklines(self, max_width: int) -> Table:
        steps = self.trace.steps
        # the session's own last step (what ran after the loop) is drawn, but the range ends at the loop's last
        sources = step_values(steps, "source")
        trained = [i for i, source in enumerate(sources) if source != "session-end"] or [len(steps) - 1]
        rows = []
        for label, values, fmt in (
            ("live saved tensors", measured_values(self.trace, step_values(steps, "live_saved_bytes")), human_bytes),
            ("nodes alive", measured_values(self.trace, step_values(steps, "live_nodes")), lambda n: f"{n:,}"),
        ):  # (a step seen light measured neither: a gap, never 0)
            rows.append((label, values, range_text(values, trained, fmt)))
        # the widest label and range text, two gaps of two columns: the sparkline gets the rest
        width = max(8, min(60, max_width - 18 - max(len(r[2]) for r in rows) - 4))  # (60 when unwrapped)
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold", min_width=18)
        grid.add_column(style="yellow")
        grid.add_column(style="dim")
        for label, values, span in rows:
            grid.add_row(label, sparkline(values, width), span)
        return grid


def other_ranks_hint(report: Path | None) -> str:
    """What a one-rank summary says about the other ranks of its job (their findings are in their own traces).

    >>> other_ranks_hint(Path("out/rank0"))
    'other ranks record their own traces; one report of all ranks: graphwatch report out/rank*/trace.json --out out'
    """
    folder = None if report is None else Path(report)
    if folder is not None and folder.suffix == ".html":
        folder = folder.parent
    base = folder.parent if folder is not None and folder.name.startswith("rank") else None
    shown = None if base is None else printable_path(base)
    where = f"{shown}/rank*/trace.json --out {shown}" if shown is not None else "RANK0.json RANK1.json ..."
    return f"other ranks record their own traces; one report of all ranks: graphwatch report {where}"


# Width when the output is no terminal (a CI log, `| tee`, a file) and COLUMNS does not say: wide enough
# that no line is hard-wrapped mid-token; the log viewer wraps.
UNWRAPPED_WIDTH = 1000


class TrimmedLines:
    """A text stream that writes to ``file`` (default: the standard error stream of the moment) without the
    spaces rich pads lines with: in a log, a copied patch or table row keeps no trailing blanks.

    >>> import io
    >>> out = io.StringIO()
    >>> stream = TrimmedLines(out)
    >>> _ = stream.write("a   \\nb  "), stream.write("  c \\n")
    >>> out.getvalue()
    'a\\nb    c\\n'
    """

    def __init__(self, file: IO[str] | None = None) -> None:
        self._file = file
        self._spaces = ""  # spaces at the end of the last write: written once more text follows on that line

    @property
    def file(self) -> IO[str]:
        return self._file if self._file is not None else sys.stderr

    def write(self, text: str) -> int:
        text, body = self._spaces + text, (self._spaces + text).rstrip(" ")
        self._spaces = text[len(body) :]
        self.file.write(re.sub(r" +\n", "\n", body))
        return len(text)

    def flush(self) -> None:
        self.file.flush()

    def __getattr__(self, name: str) -> object:  # isatty, encoding, fileno: the stream's own
        return getattr(self.file, name)


class _Console(Console):
    """A console that, when its reader has gone (``graphwatch run train.py 2>&1 | head -1``), stops printing
    and lets the program go on: rich's own exits with status 1, which would replace the script's exit code."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        silence_broken_pipe(self.file)


def silence_broken_pipe(stream: object) -> None:
    """Point ``stream``'s file descriptor at ``/dev/null`` (its reader has gone): what is still buffered for
    it, and Python's last flush at exit, then go nowhere instead of failing (exit status 120) or printing a
    traceback."""
    try:
        fileno = stream.fileno()  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fileno)
    finally:
        os.close(devnull)


def make_console(file: IO[str] | None = None) -> Console:
    """A console for the summary: standard error by default; no colour codes when ``NO_COLOR`` is set; not
    hard-wrapped, and lines not padded with spaces, when it writes to no terminal (``COLUMNS`` may set a width).

    >>> import io
    >>> console = make_console(io.StringIO())
    >>> console.is_terminal, console.width
    (False, 1000)
    """
    console = _Console(
        file=file,
        stderr=file is None,
        color_system=None if os.environ.get("NO_COLOR") else "auto",
        highlight=False,
    )
    if not console.is_terminal:
        console.file = cast(IO[str], TrimmedLines(file))
        if "COLUMNS" not in os.environ:
            console.width = UNWRAPPED_WIDTH
    return console


def print_summary(trace: Trace, console: Console | None = None, report: Path | None = None) -> None:
    """Print :class:`Summary` of ``trace`` to ``console`` (default: :func:`make_console`).

    ``report`` is the report written (its folder or index.html); the summary ends by pointing at it.

    >>> import io
    >>> from graphwatch.model import Trace
    >>> print_summary(Trace(), console=make_console(io.StringIO()))
    """
    console = console or make_console()
    print_blocks(console, Summary(trace, report).blocks(console.width))
