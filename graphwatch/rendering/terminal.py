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
from collections.abc import Callable, Iterator, Sequence
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
from ..model import Finding, Trace
from .charts import SPARK_ASCII, SPARK_BLOCKS, sparkline
from .patch_checks import check_text
from .wording import (
    averaged_text,
    cited_sites,
    counted_only_text,
    early_end,
    explained_in_error,
    finding_steps,
    marked_steps,
    sample_steps,
    seconds_text,
    step_values,
    steps_text,
    verdict,
)

_SEVERITY_STYLE = {"error": "bold red", "warning": "bold yellow", "info": "bold blue"}
_SEVERITY_MARK = {"error": "✖", "warning": "▲", "info": "●"}
# one ASCII character for each non-ASCII one the summary draws, so columns stay aligned
_ASCII = str.maketrans(
    dict(zip(SPARK_BLOCKS, SPARK_ASCII))
    | {"–": "-", "…": ".", "→": ">", "·": "/", "⋯": ":", "✖": "x", "▲": "!", "●": "*", "²": "2"}
)


# ------------------------------------------------------------------------- rich output
def finding_lines(
    finding: Finding, note: str = "", in_error: bool = False, patch_above: str | None = None
) -> Iterator[RenderableType]:
    """One finding as the summary shows it: kind and steps (and ``note``, e.g. ``only on rank 1``), message, fix,
    patch, lines.

    ``in_error``: the error that ended the run holds the explanation; one line points at it.
    ``patch_above``: the kind of a finding printed above with the same patch (it is not printed again).

    >>> [type(part).__name__ for part in finding_lines(Finding("retained-graph", "warning", 3, "m", "f"))]
    ['Text', 'Padding', 'Padding']
    """
    mark = _SEVERITY_MARK.get(finding.severity, "●")
    yield Text.assemble(
        (f"{mark} {finding.kind}", _SEVERITY_STYLE.get(finding.severity, "bold")),
        (f"  {note}", "bold magenta") if note else "",
        (f"  {steps_text(finding_steps(finding))}", "dim"),
    )
    if in_error:
        yield Padding(Text("explained, with its fixes, in the error that ended the run (its traceback)"), (0, 0, 0, 2), expand=False)
    else:
        yield Padding(Text(finding.message), (0, 0, 0, 2), expand=False)
    if not in_error and finding.fix not in finding.message:  # an explanation lists its fixes: not again
        yield Padding(Text.assemble(("fix: ", "bold green"), finding.fix), (0, 0, 0, 2), expand=False)
    if finding.patch and patch_above:
        yield Padding(Text.assemble(("patch: ", "bold green"), f"the one under {patch_above} above"), (0, 0, 0, 2), expand=False)
    elif finding.patch:
        yield Padding(Text("patch (patch -p0):", style="bold green"), (0, 0, 0, 2), expand=False)
        yield Padding(diff_text(finding.patch), (0, 0, 0, 4), expand=False)
        if finding.check is not None:
            yield Padding(check_text(finding.check), (0, 0, 0, 2), expand=False)
    sites = cited_sites(finding)
    if sites:
        yield Padding(Text.assemble(("at: ", "bold"), (", ".join(sites), "cyan")), (0, 0, 0, 2), expand=False)


def findings_lines(findings: Sequence[Finding], in_error: Callable[[Finding], bool] | None = None) -> Iterator[RenderableType]:
    """Each of ``findings`` by :func:`finding_lines`, a blank line between them; a patch two findings share
    (a backward-twice error and the carried graph behind it) is printed under the first only.

    >>> f = Finding("retained-graph", "warning", 3, "m", "f", patch="--- a.py\\n+++ a.py\\n")
    >>> [type(part).__name__ for part in findings_lines([f, f])].count("Padding")
    7
    """
    printed: dict[str, str] = {}  # patch -> the kind of the finding it was printed under
    for i, finding in enumerate(findings):
        if i:
            yield Text("")
        yield from finding_lines(finding, in_error=bool(in_error and in_error(finding)), patch_above=printed.get(finding.patch or ""))
        if finding.patch:
            printed.setdefault(finding.patch, finding.kind)


def diff_text(patch: str) -> Text:
    """A unified diff, its added lines green and removed ones red (no wrapping: a diff line is code)."""
    text = Text(no_wrap=True, overflow="ignore")
    for line in patch.rstrip("\n").splitlines():
        style = "green" if line.startswith("+") and not line.startswith("+++") else ""
        style = "red" if line.startswith("-") and not line.startswith("---") else style
        text.append(line + "\n", style=style or "dim")
    text.rstrip()
    return text


def ascii_safe(console: Console, options: ConsoleOptions, parts: Sequence[RenderableType]) -> RenderResult:
    """Render ``parts``; on a console that cannot encode unicode, as ASCII (rich already draws boxes in ASCII there)."""
    if not options.ascii_only:
        yield from parts
        return
    for segment in console.render(Group(*parts), options):
        text = segment.text.translate(_ASCII).encode("ascii", "replace").decode("ascii")
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
        boxed = options.max_width < UNWRAPPED_WIDTH  # unwrapped output (no terminal): no box as wide as the log
        yield from ascii_safe(console, options, list(self._parts(options.max_width, boxed)))

    def _parts(self, max_width: int, boxed: bool = True) -> Iterator[RenderableType]:
        trace = self.trace
        text, good = verdict([trace])
        line = Text(text, style="bold green" if good else "bold red")
        one_of_ranks = self.title is None and (trace.world_size or 1) > 1
        title = f"rank {trace.rank} of {trace.world_size}" if one_of_ranks else self.title
        if title:
            line.append(f"  ({title})", style="dim")
        yield line
        if one_of_ranks:
            yield Text(other_ranks_hint(self.report), style="dim")
        if trace.ended_early:
            yield Text(f"the run ended early: {early_end(trace)}", style="yellow")
        if trace.untracked_saved:
            yield Text(
                f"{counted(trace.untracked_saved, 'saved tensor')} went through hooks graphwatch cannot see "
                "(saved_tensors_hooks entered inside the session); they are not counted",
                style="dim",
            )
        for notice in (averaged_text(trace), counted_only_text(trace)):
            if notice:
                yield Text(notice, style="dim")
        if trace.findings and boxed:
            yield Panel(
                Group(*self._findings()),
                title="findings",
                title_align="left",
                border_style="red" if not good else "blue",
            )
        elif trace.findings:
            yield Text("findings", style="bold")
            yield from self._findings()
        if trace.steps:
            yield self._table()
            yield self._sparklines(max_width)
        if self.report is not None:
            index = Path(self.report)
            yield Text.assemble(("report: ", "bold"), str(index if index.suffix == ".html" else index / "index.html"))

    def _findings(self) -> Iterator[RenderableType]:
        yield from findings_lines(self.trace.findings, lambda finding: explained_in_error(self.trace, finding))

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
        for name in ("step", "nodes\nmade", "backward", "live\nsaved", "nodes\nalive"):
            table.add_column(name, justify="right", no_wrap=True)
        table.add_column("first seen", style="red", overflow="fold")
        for row in rows:
            if isinstance(row, int):
                table.add_row("⋯", "", "", "", "", f"{counted(row, 'step')} omitted", style="dim")
                continue
            backward = f"{len(row.backwards)} · {seconds_text(row.backward_seconds)}" if row.backwards else "–"
            table.add_row(
                str(row.index),
                f"{row.nodes_created:,}",
                backward,
                human_bytes(row.live_saved_bytes),
                f"{row.live_nodes:,}",
                marks.get(row.index, ""),
            )
        return table

    def _sparklines(self, max_width: int) -> Table:
        steps = self.trace.steps
        # the session's own last step (what ran after the loop) is drawn, but the range ends at the loop's last
        sources = step_values(steps, "source")
        trained = [i for i, source in enumerate(sources) if source != "session-end"] or [len(steps) - 1]
        rows = []
        for label, values, fmt in (
            ("live saved tensors", step_values(steps, "live_saved_bytes"), human_bytes),
            ("nodes alive", step_values(steps, "live_nodes"), lambda n: f"{n:,}"),
        ):
            top = max(range(len(values)), key=values.__getitem__)
            span = f"{fmt(values[trained[0]])} → {fmt(values[trained[-1]])} (max {fmt(values[top])}, step {top})"
            rows.append((label, values, span))
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
    where = f"{base}/rank*/trace.json --out {base}" if base is not None else "RANK0.json RANK1.json ..."
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


def make_console(file: IO[str] | None = None) -> Console:
    """A console for the summary: standard error by default; no colour codes when ``NO_COLOR`` is set; not
    hard-wrapped, and lines not padded with spaces, when it writes to no terminal (``COLUMNS`` may set a width).

    >>> import io
    >>> console = make_console(io.StringIO())
    >>> console.is_terminal, console.width
    (False, 1000)
    """
    console = Console(
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
    (console or make_console()).print(Summary(trace, report))
