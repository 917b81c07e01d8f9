"""Reports over the ranks of one ``torch.distributed`` job: one folder per rank, findings only some ranks have.

Each process of a job launched by ``torchrun`` records its own trace, with
``trace.rank`` and ``trace.world_size``; with ``out=`` (or ``graphwatch run
--out DIR``) rank ``r`` writes ``DIR/rank{r}/``, so no two ranks write one file.
Several rank traces of one job (distinct ranks, one world size) make a *rank
set*: its report counts a problem once however many ranks show it, and marks
the ones seen on only some ranks ("only on rank 1"), the mark of a
rank-dependent branch (logging, evaluation, a rank-0-only cache) that carries a
graph.  Two findings are the same problem when their kind and cited lines match.

Example::

    >>> from graphwatch.model import Finding, StepRecord, Trace
    >>> def rank(r, *findings):
    ...     steps = [StepRecord(index=i, source="optimizer") for i in range(4)]
    ...     return Trace(rank=r, world_size=2, steps=steps, findings=list(findings))
    >>> leak = Finding("graph-kept-alive", "warning", 1, "m", "f", {"sites": ["train.py:30"]})
    >>> traces = [rank(0), rank(1, leak)]
    >>> is_rank_set(traces), rank_verdict(traces)
    (True, ('graphwatch: 1 problem in 2 ranks, 4 steps each (only on rank 1)', False))
    >>> [(s.finding.kind, s.note) for s in shared_findings(traces)]
    [('graph-kept-alive', 'only on rank 1')]
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..analysis.evidence import human_bytes
from ..analysis.growth import live_counts_measured, measured_values
from ..model import Finding, StepRecord, Trace
from .charts import sparkline
from .finding_blocks import finding_lines, numbered_patches, patch_blocks
from .terminal import ascii_safe
from .visible import html_attr
from .wording import (
    NOTHING_WATCHED,
    cited_sites,
    marked_steps,
    nothing_watched,
    problems,
    sample_steps,
    seconds_text,
    step_values,
    verdict,
)

RANK_FOLDER = "rank{}"


def rank_folder(out: Path, trace: Trace) -> Path:
    """Where a trace's report goes: ``out/rank{r}`` in a job of several processes, else ``out`` itself.

    >>> str(rank_folder(Path("out"), Trace(rank=1, world_size=2))), str(rank_folder(Path("out"), Trace()))
    ('out/rank1', 'out')
    """
    if (trace.world_size or 1) > 1 and trace.rank is not None:
        return Path(out) / RANK_FOLDER.format(trace.rank)
    return Path(out)


def is_rank_set(traces: Sequence[Trace]) -> bool:
    """True for two or more traces of distinct ranks of one job (the same world size above one).

    >>> is_rank_set([Trace(rank=0, world_size=2), Trace(rank=0, world_size=2)])
    False
    """
    sizes = {t.world_size for t in traces}
    ranks = [t.rank for t in traces]
    return (
        len(traces) > 1 and len(sizes) == 1 and (traces[0].world_size or 1) > 1
        and None not in ranks and len(set(ranks)) == len(ranks)
    )


def _ranks_text(ranks: Sequence[int | None]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


@dataclass(frozen=True, slots=True)
class SharedFinding:
    """One problem as the ranks of a job saw it: the finding of the lowest rank that has it, and which ranks do."""

    finding: Finding
    ranks: tuple[int, ...]
    note: str  # "only on rank 1", or "" when every rank given has it


def _problem_key(finding: Finding) -> tuple[str, tuple[str, ...]]:
    return finding.kind, tuple(sorted(cited_sites(finding)))


def shared_findings(traces: Sequence[Trace]) -> list[SharedFinding]:
    """Every trace's findings grouped by problem (kind and cited lines), in the order the lowest rank saw them."""
    groups: dict[tuple[str, tuple[str, ...]], tuple[Finding, list[int]]] = {}
    for trace in sorted(traces, key=lambda t: t.rank or 0):
        for finding in trace.findings:
            _, ranks = groups.setdefault(_problem_key(finding), (finding, []))
            if trace.rank not in ranks:
                ranks.append(trace.rank or 0)
    return [
        SharedFinding(first, tuple(ranks), "" if len(ranks) == len(traces) else f"only on {_ranks_text(ranks)}")
        for first, ranks in groups.values()
    ]


def rank_notes(traces: Sequence[Trace]) -> dict[int, str]:
    """``id(finding)`` -> its rank note (``only on rank 1``), for every finding of each trace that has one."""
    notes = {_problem_key(s.finding): s.note for s in shared_findings(traces) if s.note}
    return {id(f): notes[_problem_key(f)] for t in traces for f in t.findings if _problem_key(f) in notes}


def rank_verdict(traces: Sequence[Trace]) -> tuple[str, bool]:
    """The verdict over the ranks of one job: each problem counted once, where only some ranks have all of them.

    >>> rank_verdict([Trace(rank=0, world_size=2), Trace(rank=1, world_size=2)])
    ('graphwatch: no steps recorded on 2 ranks', True)
    """
    counts = sorted(len(t.steps) for t in traces)
    each = f"{counts[0]:,} step{'' if counts[0] == 1 else 's'} each" if counts[0] == counts[-1] else (
        f"{counts[0]:,}–{counts[-1]:,} steps"
    )
    where = f"{len(traces)} ranks, {each}"
    found = [s for s in shared_findings(traces) if s.finding.severity != "info"]
    if not found:
        if not counts[-1]:
            return f"graphwatch: no steps recorded on {len(traces)} ranks", True
        if all(nothing_watched(t) for t in traces):
            return f"graphwatch: {NOTHING_WATCHED} on {len(traces)} ranks", False
        return f"graphwatch: no graph leaks in {where}", True
    notes = {s.note for s in found}
    only = f" ({notes.pop()})" if len(notes) == 1 and "" not in notes else ""
    return f"graphwatch: {len(found)} problem{'' if len(found) == 1 else 's'} in {where}{only}", False


def report_verdict(traces: Sequence[Trace]) -> tuple[str, bool]:
    """:func:`rank_verdict` for a rank set, else the summary's :func:`~graphwatch.rendering.wording.verdict`."""
    return rank_verdict(traces) if is_rank_set(traces) else verdict(traces)


@dataclass(frozen=True, slots=True)
class RankRow:
    """One rank's totals in the cross-rank table."""

    rank: int
    steps: int
    problems: int
    # (None when no step of the rank measured its live counts: at the default level, a step seen light did not)
    peak_saved: int | None  # largest live saved bytes at a step end
    peak_nodes: int | None  # most autograd nodes alive at a step end
    backward_seconds: float
    ended_early: str | None

    @classmethod
    def of(cls, trace: Trace) -> RankRow:
        steps = trace.steps
        return cls(
            trace.rank or 0,
            len(steps),
            len(problems(trace)),
            _peak(measured_values(trace, step_values(steps, "live_saved_bytes"))),
            _peak(measured_values(trace, step_values(steps, "live_nodes"))),
            sum(step_values(steps, "backward_seconds")),
            trace.ended_early,
        )

    def cells(self) -> list[str]:
        """The row as table cells, in the order of :data:`RANK_COLUMNS`."""
        early = (self.ended_early or "").strip().splitlines()
        return [
            str(self.rank), f"{self.steps:,}", f"{self.problems:,}",
            "–" if self.peak_saved is None else human_bytes(self.peak_saved),
            "–" if self.peak_nodes is None else f"{self.peak_nodes:,}",
            seconds_text(self.backward_seconds), early[0][:60] if early else "–",
        ]


def _peak(values: Sequence[int | None]) -> int | None:
    """The largest of the measured ``values`` (None: not measured), None when none was."""
    return max((v for v in values if v is not None), default=None)


RANK_COLUMNS = ("rank", "steps", "problems", "peak live saved", "peak nodes alive", "backward time", "ended early")


def _by_rank(traces: Sequence[Trace]) -> list[Trace]:
    return sorted(traces, key=lambda t: t.rank or 0)


def _missing(traces: Sequence[Trace]) -> str:
    """A note when the traces given are not all the ranks of the job."""
    given = {t.rank for t in traces}
    missing = [r for r in range(traces[0].world_size or 0) if r not in given]
    return f"no trace of {_ranks_text(missing)} (of {traces[0].world_size}): marks compare the ranks given" if missing else ""


# ------------------------------------------------------------------------------------- HTML
def _first_seen(traces: Sequence[Trace]) -> dict[int, str]:
    """Step -> the kinds first seen in it, each marked with its ranks unless every rank saw it there."""
    seen: dict[int, dict[str, list[int]]] = {}
    for trace in traces:
        for step, kinds in marked_steps(trace).items():
            for kind in kinds.split(", "):
                seen.setdefault(step, {}).setdefault(kind, []).append(trace.rank or 0)
    return {
        step: ", ".join(k if len(r) == len(traces) else f"{k} ({_ranks_text(r)})" for k, r in kinds.items())
        for step, kinds in seen.items()
    }


def _step_table_html(traces: Sequence[Trace]) -> str:
    marks = _first_seen(traces)
    skeleton = max(traces, key=lambda t: len(t.steps)).steps
    # a step sits at its own index (checked when a trace loads); a step seen light measured no live count: "–"
    lookup = [(t.steps, live_counts_measured(t)) for t in traces]
    metrics: tuple[tuple[str, Callable[[StepRecord], str]], ...] = (
        ("live saved", lambda s: human_bytes(s.live_saved_bytes)),
        ("nodes alive", lambda s: f"{s.live_nodes:,}"),
    )
    width = 2 + len(metrics) * len(traces)
    head = (
        '<tr><th rowspan="2">step</th>'
        + "".join(f'<th colspan="{len(traces)}">{html_attr(name)}</th>' for name, _ in metrics)
        + '<th rowspan="2">first seen</th></tr><tr>'
        + "".join(f"<th>rank {t.rank}</th>" for _ in metrics for t in traces)
        + "</tr>"
    )
    body = []
    for row in sample_steps(skeleton, marks, head=10, tail=10, most=60):
        if isinstance(row, int):
            body.append(f'<tr class="gap"><td colspan="{width}">⋯ {row:,} step{"" if row == 1 else "s"} omitted</td></tr>')
            continue
        cells = [str(row.index)]
        for _, value in metrics:
            cells += [
                value(steps[row.index]) if row.index < len(steps) and measured(row.index) else "–"
                for steps, measured in lookup
            ]
        cells.append(marks.get(row.index, ""))
        body.append(
            ('<tr class="marked">' if row.index in marks else "<tr>")
            + "".join(f"<td>{html_attr(c)}</td>" for c in cells)
            + "</tr>"
        )
    return (
        f'<div class="table-wrap"><table class="steps ranked"><thead>{head}</thead>'
        f'<tbody>{"".join(body)}</tbody></table></div>'
    )


def ranks_html(traces: Sequence[Trace], anchors: Sequence[str]) -> str:
    """The "across ranks" section of a rank set's report: a table per rank, the problems with the ranks that
    show them (linked to that rank's section, ``anchors[i]`` for ``traces[i]``) and a per-step table with a
    column per rank."""
    anchor = {t.rank: a for t, a in zip(traces, anchors)}
    traces = _by_rank(traces)
    rows = "".join(
        "<tr>" + "".join(f"<td>{html_attr(c)}</td>" for c in RankRow.of(t).cells()) + "</tr>" for t in traces
    )
    head = "".join(f"<th>{html_attr(name)}</th>" for name in RANK_COLUMNS)
    items = []
    for shared in shared_findings(traces):
        f = shared.finding
        links = ", ".join(f'<a href="#{html_attr(anchor[r])}">rank {r}</a>' for r in shared.ranks)
        note = f'<span class="ranks">{html_attr(shared.note)}</span>' if shared.note else "on every rank"
        sites = ", ".join(cited_sites(f))
        items.append(
            f'<li><code class="kind">{html_attr(f.kind)}</code> {note}{" at <code>" + html_attr(sites) + "</code>" if sites else ""}'
            f" — {links}</li>"
        )
    missing = _missing(traces)
    return (
        '<section class="run" id="ranks"><h2>Across ranks</h2>'
        f'<p class="meta">{len(traces)} ranks of a job of {traces[0].world_size} processes; a problem is counted once '
        "however many ranks show it, and marked when only some do.</p>"
        + (f'<p class="notice">{html_attr(missing)}</p>' if missing else "")
        + f'<div class="table-wrap"><table class="steps ranked"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody>'
        "</table></div><h3>Problems</h3>"
        + (f'<ul class="across">{"".join(items)}</ul>' if items else '<p class="empty">No findings on any rank.</p>')
        + "<h3>Per step, per rank</h3>"
        + (_step_table_html(traces) if any(t.steps for t in traces) else '<p class="empty">No steps were recorded.</p>')
        + "</section>"
    )


RANKS_CSS = """
.ranks{font-size:12px;font-weight:700;color:#fff;background:#8250df;border-radius:10px;padding:1px 8px}
ul.across{margin:0;padding-left:20px}ul.across li{margin:4px 0}
.steps.ranked th,.steps.ranked td{text-align:right!important}
.steps.ranked th:last-child,.steps.ranked td:last-child{text-align:left!important}
.steps.ranked thead tr:first-child th{text-align:center!important}
"""


# ---------------------------------------------------------------------------------- terminal
class RankSummary:
    """A rich renderable: the summary of the ranks of one job (a verdict, a row per rank, each problem once).

    ``report`` is where the combined report was written; ``note`` a line to add (e.g. ranks that sent no trace).
    """

    def __init__(self, traces: Sequence[Trace], report: Path | None = None, note: str = "") -> None:
        self.traces = _by_rank(traces)
        self.report = report
        self.note = note

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from ascii_safe(console, options, self.blocks(options.max_width))

    def blocks(self, max_width: int) -> list[RenderableType]:
        """The parts in order; the patches outside the findings' box, as they are (``terminal.print_blocks``)."""
        return list(self._parts(max_width))

    def _parts(self, max_width: int) -> Iterator[RenderableType]:
        text, good = rank_verdict(self.traces)
        yield Text(text, style="bold green" if good else "bold red")
        for note in (self.note, _missing(self.traces)):
            if note:
                yield Text(note, style="yellow")
        rows = [RankRow.of(t) for t in self.traces]
        early = any(row.ended_early for row in rows)  # the column only when a rank ended early
        table = Table(box=box.SIMPLE_HEAD, title="per rank", title_justify="left")
        for name in RANK_COLUMNS[: None if early else -1]:
            table.add_column(name.replace(" ", "\n", 1), justify="left" if name == "ended early" else "right")
        table.add_column("nodes alive\nper step", style="yellow", no_wrap=True)
        spark = max(8, min(40, max_width - (90 if early else 70)))
        for row, trace in zip(rows, self.traces):
            cells = row.cells()[: None if early else -1]
            table.add_row(*cells, sparkline(measured_values(trace, step_values(trace.steps, "live_nodes")), spark))
        shared = shared_findings(self.traces)
        if shared:
            findings = [item.finding for item in shared]
            patches = numbered_patches(findings)
            parts: list[RenderableType] = []
            for i, item in enumerate(shared):
                number = patches.get(item.finding.patch or "")
                parts += ([Text("")] if i else []) + list(finding_lines(item.finding, item.note, patch_number=number))
            yield Panel(Group(*parts), title="findings", title_align="left", border_style="blue" if good else "red")
            yield from patch_blocks(findings, patches)
        yield table
        if self.report is not None:
            index = Path(self.report)
            yield Text.assemble(("report: ", "bold"), str(index if index.suffix == ".html" else index / "index.html"))


# ----------------------------------------------------------------------------- gathering
def wait_for_ranks(
    out: Path,
    world_size: int,
    *,
    since: float,
    timeout: float,
    stop: Callable[[], bool] = lambda: False,
    notify: Callable[[list[int]], None] | None = None,
) -> dict[int, Path]:
    """Rank -> ``out/rank{r}/trace.json``, for each rank whose trace was written since ``since`` (a ``time.time()``).

    Waits until every rank's trace is there, ``timeout`` seconds pass or ``stop()`` says so; ``notify(missing)``
    is called once if the wait lasts more than a few seconds.  Traces are written atomically, so one that exists
    is complete.

    >>> import tempfile
    >>> wait_for_ranks(Path(tempfile.mkdtemp()), 2, since=0, timeout=0)
    {}
    """
    deadline = time.monotonic() + timeout
    notify_at = time.monotonic() + 3.0
    found: dict[int, Path] = {}
    while True:
        for rank in range(world_size):
            path = Path(out) / RANK_FOLDER.format(rank) / "trace.json"
            if rank not in found and _written_since(path, since):
                found[rank] = path
        missing = [r for r in range(world_size) if r not in found]
        now = time.monotonic()
        if not missing or now >= deadline or stop():
            return dict(sorted(found.items()))
        if notify is not None and now >= notify_at:
            notify(missing)
            notify = None
        time.sleep(0.1)


def _written_since(path: Path, since: float) -> bool:
    try:
        return os.stat(path).st_mtime >= since
    except OSError:
        return False
