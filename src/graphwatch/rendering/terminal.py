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
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, cast

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.padding import Padding
from rich.panel import Panel
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from ..analysis.evidence import counted, human_bytes
from ..analysis.growth import live_counts_measured, measured_values
from ..model import Finding, Trace
from .charts import SPARK_ASCII, SPARK_BLOCKS, range_text, sparkline
from .patch_checks import check_text
from .patch_file import not_for_copying
from .visible import visible
from .wording import (
    averaged_text,
    cited_sites,
    counted_only_text,
    detail_text,
    ending_text,
    explained_in_error,
    finding_steps,
    marked_steps,
    nothing_watched_text,
    sample_steps,
    seconds_text,
    step_values,
    steps_text,
    time_text,
    verdict,
)

_LINE_BREAKS = re.compile("[\t\n]")  # what :func:`visible` leaves as they are; a printed path shows them escaped
_SEVERITY_STYLE = {"error": "bold red", "warning": "bold yellow", "info": "bold blue"}
_SEVERITY_MARK = {"error": "✖", "warning": "▲", "info": "●"}
# one ASCII character for each non-ASCII one the summary draws, so columns stay aligned
_ASCII = str.maketrans(
    dict(zip(SPARK_BLOCKS, SPARK_ASCII))
    | {"–": "-", "…": ".", "→": ">", "·": "/", "⋯": ":", "✖": "x", "▲": "!", "●": "*", "²": "2"}
)


# ------------------------------------------------------------------------- rich output
def finding_lines(
    finding: Finding, note: str = "", in_error: bool = False, patch_above: str | None = None,
    patch_number: int | None = None, cwd: str | None = None,
) -> Iterator[RenderableType]:
    """One finding as the summary shows it: kind and steps (and ``note``, e.g. ``only on rank 1``), message, fix,
    patch, lines.

    ``in_error``: the error that ended the run holds the explanation; one line points at it.
    ``patch_above``: the kind of a finding printed above with the same patch (it is not printed again).
    ``patch_number``: the patch is printed below, outside any box, as that number (:func:`patch_blocks`); only
    a line points at it.  Otherwise the patch follows, exactly as it is (:class:`Verbatim`), unless it is not
    to be copied (:func:`~graphwatch.rendering.patch_file.not_for_copying`; ``cwd``: the run's folder).

    >>> [type(part).__name__ for part in finding_lines(Finding("retained-graph", "warning", 3, "m", "f"))]
    ['Text', 'Padding', 'Padding']
    """
    mark = _SEVERITY_MARK.get(finding.severity, "●")
    yield Text.assemble(
        (f"{mark} {printable(finding.kind)}", _SEVERITY_STYLE.get(finding.severity, "bold")),
        (f"  {printable(note)}", "bold magenta") if note else "",
        (f"  {steps_text(finding_steps(finding))}", "dim"),
    )
    if in_error:
        yield Padding(Text("explained, with its fixes, in the error that ended the run (its traceback)"), (0, 0, 0, 2), expand=False)
    else:
        yield Padding(Text(printable(finding.message)), (0, 0, 0, 2), expand=False)
    if not in_error and finding.fix not in finding.message:  # an explanation lists its fixes: not again
        yield Padding(Text.assemble(("fix: ", "bold green"), printable(finding.fix)), (0, 0, 0, 2), expand=False)
    warning = not_for_copying(finding.patch, cwd, finding.check) if finding.patch else None
    if finding.patch and warning is not None:  # never offered for copying: shown marked, in the box
        head = f"patch, not for copying: {warning}; it is shown as text, any hidden character marked:"
        yield Padding(Text(head, style="bold red"), (0, 0, 0, 2), expand=False)
        yield Padding(diff_text(finding.patch), (0, 0, 0, 4), expand=False)
    elif finding.patch and patch_number is not None:
        yield Padding(Text.assemble(("patch: ", "bold green"), f"{patch_number}, printed below"), (0, 0, 0, 2), expand=False)
    elif finding.patch and patch_above:
        above = f"the one under {printable(patch_above)} above"
        yield Padding(Text.assemble(("patch: ", "bold green"), above), (0, 0, 0, 2), expand=False)
    elif finding.patch:
        yield Padding(Text("patch (patch -p0):", style="bold green"), (0, 0, 0, 2), expand=False)
        yield Verbatim(finding.patch)
    if finding.patch and not patch_above:  # checked by graphwatch run --check-fixes, or unchecked
        yield Padding(check_text(finding.check), (0, 0, 0, 2), expand=False)
    sites = cited_sites(finding)
    if sites:
        yield Padding(Text.assemble(("at: ", "bold"), (printable(", ".join(sites)), "cyan")), (0, 0, 0, 2), expand=False)


def findings_lines(
    findings: Sequence[Finding], in_error: Callable[[Finding], bool] | None = None,
    patch_numbers: Mapping[str, int] | None = None, cwd: str | None = None,
) -> Iterator[RenderableType]:
    """Each of ``findings`` by :func:`finding_lines`, a blank line between them; a patch two findings share
    (a backward-twice error and the carried graph behind it) is printed under the first only.
    ``patch_numbers`` (patch -> its number, :func:`numbered_patches`): the patches are printed elsewhere.
    ``cwd``: the folder the run ran in (:func:`finding_lines`).

    >>> f = Finding("retained-graph", "warning", 3, "m", "f", patch="--- a.py\\n+++ a.py\\n")
    >>> [type(part).__name__ for part in findings_lines([f, f])].count("Padding")
    7
    """
    printed: dict[str, str] = {}  # patch -> the kind of the finding it was printed under
    for i, finding in enumerate(findings):
        if i:
            yield Text("")
        number = patch_numbers.get(finding.patch or "") if patch_numbers is not None else None
        yield from finding_lines(
            finding, in_error=bool(in_error and in_error(finding)), patch_above=printed.get(finding.patch or ""),
            patch_number=number, cwd=cwd,
        )
        if finding.patch:
            printed.setdefault(finding.patch, finding.kind)


def numbered_patches(findings: Sequence[Finding], cwd: str | None = None) -> dict[str, int]:
    """Each distinct patch of ``findings`` that may be offered for copying -> its number (1, 2, ...), in the
    findings' order (a patch holding hidden or reordering characters, or writing outside ``cwd``, the run's
    folder, is shown as text under its finding: :func:`~graphwatch.rendering.patch_file.not_for_copying`).

    >>> f = Finding("retained-graph", "warning", 3, "m", "f", patch="--- a.py\\n+++ a.py\\n")
    >>> numbered_patches([f, f, Finding("retained-graph", "warning", 4, "m", "f")])
    {'--- a.py\\n+++ a.py\\n': 1}
    """
    numbers: dict[str, int] = {}
    for finding in findings:
        if finding.patch and finding.patch not in numbers and not_for_copying(finding.patch, cwd, finding.check) is None:
            numbers[finding.patch] = len(numbers) + 1
    return numbers


def patch_blocks(findings: Sequence[Finding], numbers: Mapping[str, int]) -> Iterator[RenderableType]:
    """The patches ``numbers`` names, each under a line that says which finding it fixes, outside any box
    and exactly as they are (:class:`Verbatim`): copied from a terminal or piped into ``patch -p0``, they apply."""
    for patch, number in numbers.items():
        fixed = [f for f in findings if f.patch == patch]
        kinds = ", ".join(dict.fromkeys(f.kind for f in fixed))
        of = f" {number} of {len(numbers)}" if len(numbers) > 1 else ""
        yield Text.assemble(("patch (patch -p0):", "bold green"), f"{of} the fix of {printable(kinds)}")
        yield Verbatim(patch)
        yield Text("")


class Verbatim:
    """Text printed exactly as it is, a patch: not boxed, wrapped, padded, styled or trimmed.

    Rendered by rich (into a console of your own), it is one unstyled, unwrapped line per line;
    :func:`print_blocks` writes it straight to the console's stream, byte for byte, trailing spaces
    included (a diff's context line may end in one).

    >>> import io
    >>> from rich.console import Console
    >>> console = Console(file=io.StringIO(), width=10, force_terminal=True)
    >>> print_blocks(console, [Verbatim("--- a.py\\n+ a long line, longer than the console  \\n")])
    >>> console.file.getvalue()
    '--- a.py\\n+ a long line, longer than the console  \\n'
    """

    def __init__(self, text: str) -> None:
        self.text = text if text.endswith("\n") else text + "\n"

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for line in self.text.splitlines():
            yield Segment(line)
            yield Segment.line()


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


def diff_text(patch: str) -> Text:
    """A unified diff, its added lines green and removed ones red (no wrapping: a diff line is code)."""
    text = Text(no_wrap=True, overflow="ignore")
    for line in patch.rstrip("\n").splitlines():
        style = "green" if line.startswith("+") and not line.startswith("+++") else ""
        style = "red" if line.startswith("-") and not line.startswith("---") else style
        text.append(printable(line) + "\n", style=style or "dim")
    text.rstrip()
    return text


def printable(text: str) -> str:
    """``text`` from a trace (a name, a message, a patch line) as a terminal may show it: every control,
    bidirectional or invisible character written as ``\\u{hex}``, so that no string a trace holds can move
    the cursor, set the terminal's title or reorder a line (:func:`~graphwatch.rendering.visible.visible`).

    >>> printable("loss\\x1b]0;pwned\\x07")
    'loss\\\\u{1b}]0;pwned\\\\u{7}'
    """
    return visible(text)


def printable_path(path: str | os.PathLike[str]) -> str:
    """A path as one line of output: :func:`printable`, and its tabs and newlines written as ``\\u{9}`` and
    ``\\u{a}`` too (a folder name holding a newline must not print a line of its own, one that reads as
    graphwatch's).

    >>> printable_path("rep\\ngraphwatch: no graph leaks")
    'rep\\\\u{a}graphwatch: no graph leaks'
    """
    return _LINE_BREAKS.sub(lambda match: f"\\u{{{ord(match[0]):x}}}", printable(os.fspath(path)))


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
            caption=None if shown == len(steps) else f"{shown} of {len(steps)} steps shown: the first, the last, "
            "and each step where a finding was first seen",
            caption_justify="left",
        )
        cpu = bool(self.trace.seconds)  # recorded (a trace of an older graphwatch has no CPU times)
        names = ("step", "nodes\nmade", "backward\nwall clock", *(("backward\nCPU",) * cpu), "live\nsaved", "nodes\nalive")
        for name in names:
            table.add_column(name, justify="right", no_wrap=True)
        table.add_column("first seen", style="red", overflow="fold")
        measured = live_counts_measured(self.trace)  # (a step seen light measured no live count: "–", never 0)
        for row in rows:
            if isinstance(row, int):
                table.add_row("⋯", *[""] * (len(names) - 1), f"{counted(row, 'step')} omitted", style="dim")
                continue
            backward = f"{len(row.backwards)} · {seconds_text(row.backward_seconds)}" if row.backwards else "–"
            backward_cpu = seconds_text(row.backward_cpu_seconds) if row.backwards else "–"
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
