"""The HTML report: one self-contained page that opens offline, plus trace.json and the snapshot SVGs.

The page has inline CSS and inline SVG only (no web font, no remote resource,
one script of its own: a patch's copy button, the only one its
Content-Security-Policy lets run): the verdict first, then per run (one run, or one section
per labelled trace for the demo or the ranks of a distributed job) each
finding with the source lines it cites, per-step charts of live saved bytes,
nodes alive and backward time, the per-step table and the snapshot gallery.
The ranks of one job (:func:`~graphwatch.rendering.ranks.is_rank_set`) get an
"across ranks" section first, and findings seen on only some ranks are marked.
Every user-derived string is HTML-escaped, its hidden characters made visible
(:mod:`graphwatch.rendering.visible`); the pictures are drawn from filtered DOT
and cleaned SVG (:mod:`graphwatch.rendering.svg`).  Files are written
atomically and ``index.html`` last, so a crash never leaves a half-written
page.  A report deletes only the snapshots an earlier report wrote and recorded
in the folder's manifest (:data:`~graphwatch.rendering.report_folder.MANIFEST`), and never writes through a link.

Example::

    >>> import tempfile
    >>> from pathlib import Path
    >>> from graphwatch.model import StepRecord, Trace
    >>> trace = Trace(steps=[StepRecord(index=0, source="optimizer", live_nodes=3)])
    >>> index = write_report(trace, Path(tempfile.mkdtemp()) / "report")
    >>> index.name, "no graph leaks in 1 step" in index.read_text()
    ('index.html', True)
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..analysis.evidence import counted, human_bytes
from ..analysis.growth import live_counts_measured
from ..errors import UsageError
from ..model import StepRecord, Trace, save_trace, write_atomically
from ..version import __version__
from .charts import NODES_COLOR, bar_chart, byte_unit, line_chart
from .findings_html import finding_articles
from .gallery import Picture, gallery_html, legend_html, render_pictures
from .ranks import RANKS_CSS, is_rank_set, rank_notes, ranks_html, report_verdict
from .report_folder import prepare_folder, remove_earlier_pictures, write_pictures
from .visible import html_attr
from .wording import (
    averaged_text,
    counted_only_text,
    detail_text,
    ending_text,
    marked_steps,
    nothing_watched_text,
    sample_steps,
    seconds_text,
    step_values,
    time_text,
)

Section = tuple[str, Trace]

# Colours follow the snapshot palette (DESIGN.md): saved tensors orange, outputs darkolivegreen,
# parameters lightblue, backward nodes grey, earlier-step nodes and findings red.
# The page's only script: a patch's copy button puts the diff on the clipboard.
COPY_SCRIPT = (
    "document.querySelectorAll('button.copy').forEach(function(b){b.addEventListener('click',function(){"
    "var t=b.closest('.patch').querySelector('pre').innerText;"
    "if(navigator.clipboard){navigator.clipboard.writeText(t).then(function(){b.textContent='copied'},"
    "function(){b.textContent='select the text to copy'})}})})"
)
# What the page may do: its own styles and the copy script above; nothing loaded, no other script, no form.
CONTENT_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; "
    f"script-src 'sha256-{base64.b64encode(hashlib.sha256(COPY_SCRIPT.encode()).digest()).decode()}'; "
    "base-uri 'none'; form-action 'none'"
)
CSS = """
:root{--ink:#1f2328;--muted:#59636e;--line:#d8dee4;--bg:#f6f8fa;--red:#d62728;--redbg:#fdecea;
--amber:#b35c00;--amberbg:#fff4e5;--green:#4a6b1f;--greenbg:#eef7e4;--orange:#e8890c;--blue:#4f8fb8}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);
font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
main{max-width:1200px;margin:0 auto;padding:24px 28px 8px}
footer{max-width:1200px;margin:0 auto;padding:8px 28px 24px;color:var(--muted);font-size:13px}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"DejaVu Sans Mono",monospace;font-size:13px}
p code,li code{background:#eef1f4;border-radius:4px;padding:1px 4px}
h1.verdict{font-size:24px;margin:0 0 20px;padding:14px 18px;border-radius:8px;border-left:6px solid}
.verdict.bad{color:var(--red);background:var(--redbg);border-color:var(--red)}
.verdict.good{color:var(--green);background:var(--greenbg);border-color:var(--green)}
div.verdict{font-weight:600;padding:6px 12px;border-radius:6px;border-left:4px solid;margin:0 0 8px}
span.verdict{font-size:13px;padding:1px 8px;border-radius:10px;margin-left:6px}
h2{font-size:20px;margin:0 0 8px}
h3{font-size:16px;margin:22px 0 10px;color:var(--muted);text-transform:uppercase;letter-spacing:.04em}
.run,.contents{background:#fff;border:1px solid var(--line);border-radius:10px;padding:18px 22px;margin:0 0 22px}
.contents ul{margin:0;padding-left:20px;columns:2}
.contents a{color:var(--ink)}
.meta{color:var(--muted);font-size:13px;margin:0 0 6px}
.meta a{color:var(--blue)}
.ended{color:var(--amber);background:var(--amberbg);padding:6px 12px;border-radius:6px}
.notice{background:var(--amberbg);border-left:4px solid var(--orange);padding:8px 12px;border-radius:4px}
.empty{color:var(--muted)}
.finding{border:1px solid var(--line);border-left:5px solid var(--amber);border-radius:8px;
padding:12px 16px;margin:0 0 14px}
.finding.error{border-left-color:var(--red)}
.finding header{display:flex;gap:10px;align-items:baseline;flex-wrap:wrap}
.badge{font-size:12px;font-weight:700;text-transform:uppercase;color:#fff;background:var(--amber);
border-radius:4px;padding:1px 7px}
.finding.error .badge{background:var(--red)}
.kind{font-size:15px;font-weight:700}
.steps{color:var(--muted);font-size:13px}
.message{white-space:pre-wrap;margin:8px 0}
.fix{background:var(--greenbg);border-radius:6px;padding:6px 10px;margin:8px 0}
.fix strong{color:var(--green)}
.patch{margin:8px 0;border:1px solid #d0d7de;border-radius:6px;overflow:hidden}
.patch-head{display:flex;gap:8px;align-items:center;padding:4px 10px;background:#f6f8fa;font-size:13px}
.patch-head button{margin-left:auto;font-size:12px;padding:2px 10px;cursor:pointer}
.patch pre{margin:0;padding:8px 10px;font-size:12px;overflow-x:auto}
.patch-same{margin:8px 0;font-size:13px}
.check{margin:8px 0;font-size:13px}.check.checked{color:#116329}.check.failed{color:#82071e}
.patch .add{color:#116329;background:#dafbe1}.patch .del{color:#82071e;background:#ffebe9}.patch .hunk{color:#57606a}
.unread{color:var(--muted);font-size:13px}
.hidden-char{color:#82071e;background:#ffebe9;border:1px solid #ff8182;border-radius:3px;padding:0 2px}
.patch-warning{margin:0 0 0 auto;color:var(--red);font-weight:600}
figure{margin:10px 0}
.source figcaption{font:600 12px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;color:var(--muted)}
.source pre{margin:2px 0 0;background:#fafbfc;border:1px solid var(--line);border-radius:6px;padding:6px 0;
overflow-x:auto}
.source pre>span{display:block;padding:0 12px 0 0}
.source .cited{background:#ffe9cc;box-shadow:inset 4px 0 var(--orange);font-weight:600}
.source .ln{display:inline-block;width:4.5em;padding-right:1em;text-align:right;color:#8c959f;user-select:none}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(340px,1fr));gap:12px}
svg.chart{width:100%;height:auto;background:#fff;border:1px solid var(--line);border-radius:8px}
svg.chart text{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Arial,sans-serif;fill:var(--ink)}
.chart-title{font-size:14px;font-weight:600}
.tick,.axis-label{font-size:12px;fill:var(--muted)!important}
.grid{stroke:#eaeef2}.axis{stroke:#8c959f}
.table-wrap{overflow-x:auto;margin-top:14px}
table.steps{border-collapse:collapse;width:100%;font-size:13px;font-variant-numeric:tabular-nums}
.steps th{text-align:right;background:var(--bg);border-bottom:2px solid var(--line);padding:6px 10px;white-space:nowrap}
.steps td{text-align:right;border-bottom:1px solid var(--line);padding:4px 10px;white-space:nowrap}
.steps td:last-child{white-space:normal}
.steps th:nth-child(2),.steps td:nth-child(2),.steps th:last-child,.steps td:last-child{text-align:left}
.steps tr.marked td{background:#fff5f5}.steps tr.marked td:last-child{color:var(--red);font-weight:600}
.steps tr.gap td{text-align:center;color:var(--muted);font-style:italic;background:var(--bg)}
/* a snapshot's card is as wide as its picture drawn at its own size (the page's width at most) */
.gallery{display:flex;flex-wrap:wrap;gap:14px;align-items:flex-start}
.snapshot{flex:0 1 auto;max-width:100%;border:1px solid var(--line);border-radius:8px;padding:10px;background:#fff}
.snapshot .svgbox{overflow-x:auto}
.snapshot svg{display:block;max-width:100%;height:auto}
.snapshot figcaption{width:0;min-width:100%;margin-top:6px;font-size:13px;color:var(--muted)}
.snapshot pre{max-height:300px;overflow:auto;background:#fafbfc;padding:8px}
.legend{display:flex;flex-wrap:wrap;gap:6px 10px;align-items:center;margin:0 0 12px;font-size:12px}
.legend span{font-family:monospace;border:1px solid #000;padding:2px 8px}
"""


def _slug(label: str, index: int) -> str:
    return f"{index}-" + (re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-") or "run")


@dataclass(frozen=True, slots=True)
class _Run:
    """One section of the report: a labelled trace, its anchor, its pictures and its JSON file name."""

    label: str
    trace: Trace
    slug: str
    pictures: list[Picture]
    trace_file: str


# --------------------------------------------------------------------- steps: charts, table
def _charts_html(trace: Trace) -> str:
    steps = trace.steps
    xs = step_values(steps, "index")
    marks = marked_steps(trace)
    saved = step_values(steps, "live_saved_bytes")
    divisor, unit = byte_unit(max(saved))
    nodes, backward = step_values(steps, "live_nodes"), step_values(steps, "backward_seconds")
    is_measured = live_counts_measured(trace)
    measured = [i for i, x in enumerate(xs) if is_measured(x)]  # (steps seen light measured no live count: not drawn)
    live_xs, live_saved, live_nodes = ([values[i] for i in measured] for values in (xs, saved, nodes))
    charts = [
        line_chart(live_xs, [v / divisor for v in live_saved], title="live saved tensors", y_label=unit, marks=marks),
        line_chart(live_xs, live_nodes, title="autograd nodes alive", y_label="nodes", color=NODES_COLOR, marks=marks),
    ] if measured else []  # fmt: skip
    charts.append(bar_chart(xs, [s * 1e3 for s in backward], title="backward time (wall clock)", y_label="ms", marks=marks))
    return '<div class="charts">' + "".join(charts) + "</div>"


_Column = tuple[str, Callable[[StepRecord], object]]
_COLUMNS: tuple[_Column, ...] = (
    ("step", lambda s: s.index),
    ("ended by", lambda s: s.source),
    ("nodes made", lambda s: f"{s.nodes_created:,}"),
    ("backwards", lambda s: len(s.backwards)),
    ("backward wall clock", lambda s: seconds_text(s.backward_seconds) if s.backwards else "–"),
    ("backward CPU", lambda s: seconds_text(s.backward_cpu_seconds) if s.backwards else "–"),
    ("live saved", lambda s: human_bytes(s.live_saved_bytes)),
    ("nodes alive", lambda s: f"{s.live_nodes:,}"),
    ("RSS", lambda s: human_bytes(s.rss_bytes) if s.rss_bytes else "–"),
)
_MEASURED_IN_FULL = ("backward CPU", "live saved", "nodes alive")  # on the steps seen in full detail only
_CUDA_COLUMN: _Column = (
    "CUDA allocated", lambda s: "–" if s.cuda_allocated is None else human_bytes(s.cuda_allocated)
)


def _table_html(trace: Trace) -> str:
    marks = marked_steps(trace)
    columns = tuple(c for c in _COLUMNS if trace.seconds or c[0] != "backward CPU")  # (older traces: no CPU times)
    columns += (_CUDA_COLUMN,) if any(v is not None for v in step_values(trace.steps, "cuda_allocated")) else ()
    measured = live_counts_measured(trace)  # (a step seen light measured no live count, no CPU time: "–")
    body = []
    for row in sample_steps(trace.steps, marks, head=10, tail=10, most=60):
        if isinstance(row, int):
            omitted = f"⋯ {row:,} step{'' if row == 1 else 's'} omitted"
            body.append(f'<tr class="gap"><td colspan="{len(columns) + 1}">{omitted}</td></tr>')
            continue
        cells = [value(row) if measured(row.index) or name not in _MEASURED_IN_FULL else "–" for name, value in columns]
        cells.append(marks.get(row.index, ""))
        body.append(
            ('<tr class="marked">' if row.index in marks else "<tr>")
            + "".join(f"<td>{html_attr(str(c))}</td>" for c in cells)
            + "</tr>"
        )
    head = "".join(f"<th>{html_attr(name)}</th>" for name, _ in columns) + "<th>first seen</th>"
    return (
        f'<div class="table-wrap"><table class="steps"><thead><tr>{head}</tr></thead>'
        f'<tbody>{"".join(body)}</tbody></table></div>'
    )


# ---------------------------------------------------------------------------- gallery
# ------------------------------------------------------------------------------- page
def _verdict_html(traces: Sequence[Trace], tag: str = "div", headline: tuple[str, bool] | None = None) -> str:
    """The verdict (or ``headline``: text, good news); inside a run's section (any tag but the page's h1)
    without the ``graphwatch:`` prefix."""
    text, good = headline or report_verdict(traces)
    if tag != "h1":
        text = text.removeprefix("graphwatch: ")
    return f'<{tag} class="verdict {"good" if good else "bad"}">{html_attr(text)}</{tag}>'


def _meta_html(trace: Trace, trace_file: str) -> str:
    facts = [
        f"torch {trace.torch_version}" if trace.torch_version else "",
        f"Python {trace.python_version}" if trace.python_version else "",
        f"started {trace.started_at}" if trace.started_at else "",
    ]
    if trace.rank is not None:
        facts.append(f"rank {trace.rank}" + (f" of {trace.world_size}" if trace.world_size else ""))
    link = [f'trace: <a href="{html_attr(trace_file)}">{html_attr(trace_file)}</a>'] if trace_file else []
    facts = [html_attr(f) for f in facts if f] + link
    notes = []
    ending = ending_text(trace)
    if ending:
        notes.append(f'<p class="ended">{html_attr(ending[0].upper() + ending[1:])}</p>')
    if trace.untracked_saved:
        notes.append(
            f'<p class="notice">{counted(trace.untracked_saved, "saved tensor")} went through saved-tensor hooks '
            "entered inside the session, which graphwatch cannot see; they are not counted.</p>"
        )
    for notice in (nothing_watched_text(trace), detail_text(trace), averaged_text(trace), counted_only_text(trace)):
        if notice:
            notes.append(f'<p class="notice">{html_attr(notice)}</p>')
    times = f'<p class="meta">{html_attr(time_text(trace))}</p>' if time_text(trace) else ""  # (below the facts: small)
    return f'<p class="meta">{" · ".join(facts)}</p>' + times + "".join(notes)


def _section_html(run: _Run, multi: bool, notes: dict[int, str], legend: str = "") -> str:
    trace = run.trace
    parts = [f'<section class="run" id="{run.slug}">']
    if run.label:
        parts.append(f"<h2>{html_attr(run.label)}</h2>")
    if multi:
        parts.append(_verdict_html([trace]))
    parts.append(_meta_html(trace, run.trace_file))
    parts.append("<h3>Findings</h3>")
    cwd = trace.options.get("cwd")
    articles = finding_articles(trace.findings, trace.sources, notes, cwd=str(cwd) if cwd else None)
    parts += articles or ['<p class="empty">No findings.</p>']
    parts.append("<h3>Per step</h3>")
    if trace.steps:
        parts += [_charts_html(trace), _table_html(trace)]
    else:
        parts.append('<p class="empty">No steps were recorded.</p>')
    parts += ["<h3>Graph snapshots</h3>", legend, gallery_html(run.pictures, run.slug), "</section>"]
    return "".join(parts)


def _contents_html(runs: Sequence[_Run], heading: str) -> str:
    items = "".join(
        f'<li><a href="#{run.slug}">{html_attr(run.label)}</a> {_verdict_html([run.trace], "span")}</li>' for run in runs
    )
    return f'<nav class="contents"><h2>{heading}</h2><ul>{items}</ul></nav>'


def _page(runs: Sequence[_Run], headline: tuple[str, bool] | None = None) -> str:
    traces = [run.trace for run in runs]
    multi, ranks = len(runs) > 1, is_rank_set(traces)
    body = [_verdict_html(traces, "h1", headline)] + ([_contents_html(runs, "Ranks" if ranks else "Runs")] if multi else [])
    if ranks:  # the ranks of one distributed job: a cross-rank section, findings marked "only on rank r"
        body.append(ranks_html(traces, [run.slug for run in runs]))
    notes = rank_notes(traces) if ranks else {}
    first = next((run for run in runs if any(p.svg is not None for p in run.pictures)), None)
    legend = legend_html() if first is not None else ""
    body += [_section_html(run, multi, notes, legend if run is first else "") for run in runs]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CONTENT_POLICY}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html_attr((headline or report_verdict(traces))[0])}</title><style>{CSS}{RANKS_CSS if ranks else ''}</style></head>"
        f'<body><main>{"".join(body)}</main><footer>graphwatch {html_attr(__version__)}</footer>'
        f"<script>{COPY_SCRIPT}</script></body></html>\n"
    )


def _sections(traces: Trace | Sequence[Section]) -> list[Section]:
    if isinstance(traces, Trace):
        return [("", traces)]
    sections = list(traces)
    if not sections or not all(isinstance(s, tuple) and len(s) == 2 and isinstance(s[1], Trace) for s in sections):
        raise UsageError("write_report() takes a Trace or a non-empty list of (label, Trace) pairs")
    return sections


def write_report(
    traces: Trace | Sequence[Section], out_dir: Path, headline: tuple[str, bool] | None = None,
    drawn: dict[str, str] | None = None,
) -> Path:
    """Write ``out_dir/index.html``, the trace JSON and ``snapshots/*.svg``; return the index.html path.

    ``traces`` is one :class:`~graphwatch.model.Trace` (its JSON goes to
    ``trace.json``) or a list of ``(label, trace)`` pairs, one report section
    each (their JSON goes to ``trace-<label>.json``).  ``headline`` (text,
    good news) replaces the verdict over the traces at the top.  Snapshots an
    earlier report wrote to ``out_dir/snapshots`` (as its manifest,
    :data:`~graphwatch.rendering.report_folder.MANIFEST`, lists them) are removed once the new report is complete;
    nothing else there is touched: not the user's own files, not a trace JSON
    this report may be made from.  Raises :class:`~graphwatch.UsageError` when
    ``out_dir`` cannot be written or its ``snapshots`` folder is a link.
    A graph drawn the same in several sections (the ranks of one job) is laid out once; ``drawn`` (DOT source to
    SVG) carries the layouts over from an earlier report of the same traces, and gets this report's.
    """
    out_dir = Path(out_dir)
    sections = _sections(traces)
    prepare_folder(out_dir)
    drawn = {} if drawn is None else drawn
    runs = []
    for i, (label, trace) in enumerate(sections):
        slug = _slug(label, i)
        file = "trace.json" if isinstance(traces, Trace) else f"trace-{slug}.json"
        runs.append(_Run(label, trace, slug, render_pictures(trace, slug, drawn), file))
    pictures = {f"snapshots/{p.file}": p.svg for run in runs for p in run.pictures if p.svg is not None}
    earlier = write_pictures(out_dir, pictures)
    for run in runs:
        save_trace(run.trace, out_dir / run.trace_file)
    index = out_dir / "index.html"
    write_atomically(index, _page(runs, headline))
    remove_earlier_pictures(out_dir, earlier, list(pictures))
    return index
