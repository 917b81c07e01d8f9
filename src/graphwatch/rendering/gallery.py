"""The snapshot gallery of the HTML report: each snapshot's focused picture, a link to its whole graph,
and one legend for the report.

Example::

    >>> from graphwatch.model import Trace
    >>> from graphwatch.rendering.gallery import gallery_html, render_pictures
    >>> gallery_html(render_pictures(Trace(), "run"), "run")
    '<p class="empty">No graph snapshots were taken in this run.</p>'
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..model import Snapshot, Trace
from .visible import html_attr, html_text

# .dot and .svg (graphviz, xml.etree) are imported where a snapshot is drawn: a report without one never loads them


def code_spans(text: str) -> str:
    """Escape ``text`` (hidden characters marked, :func:`~graphwatch.rendering.visible.html_text`) and show its
    `backticked` parts as code."""
    return re.sub(r"`([^`\n]+)`", r"<code>\1</code>", html_text(text))


@dataclass(frozen=True, slots=True)
class Picture:
    """A rendered snapshot: its file name under ``snapshots/`` and its SVG, or why there is none.

    ``svg`` is None when ``dot`` is missing (``error`` None) or failed on this graph (``error`` says how).
    """

    snapshot: Snapshot
    file: str
    svg: str | None  # the whole graph, written to snapshots/<file>
    error: str | None = None
    focus: str | None = None  # the focused picture shown in the page (None: the page shows ``svg``)


def scoped_ids(svg: str, prefix: str) -> str:
    """Prefix Graphviz's ids (``graph0``, ``node1``, ...) so several inlined drawings never share one."""
    svg = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{prefix}{m[1]}"', svg)
    return re.sub(r'(href="#|url\(#)([^")]+)', lambda m: f"{m[1]}{prefix}{m[2]}", svg)


MAX_PICTURES = 48  # snapshots drawn per run (a session takes 12 at most, besides one per error)
MAX_SHOWN_DOT = 20_000  # characters of an undrawn snapshot's DOT shown in the page


def render_pictures(trace: Trace, slug: str, drawn: dict[str, str] | None = None) -> list[Picture]:
    """Each snapshot of ``trace`` drawn (the first :data:`MAX_PICTURES`), or why it is not; the graphs not drawn
    yet laid out by one ``dot`` process (:func:`~graphwatch.rendering.svg.render_svgs`).

    ``drawn`` maps DOT sources already laid out (for another section or another report of the same run) to their
    SVG: a source found there is not laid out again, and each one drawn here is added to it.
    """
    drawn = {} if drawn is None else drawn
    wanted = [graph for snap in trace.snapshots[:MAX_PICTURES] for graph in (snap.dot, snap.focus) if graph]
    new = list(dict.fromkeys(graph for graph in wanted if graph not in drawn))
    failed: dict[str, Exception] = {}  # (a graph dot cannot lay out must not cost the whole report)
    if new:  # (a report without a graph to draw never loads the drawing code)
        from .svg import DotError, render_svgs

        for source, result in zip(new, render_svgs(new) or ()):  # (None: no dot program)
            if isinstance(result, DotError):
                failed[source] = result
            else:
                drawn[source] = result
    pictures = []
    for i, snap in enumerate(trace.snapshots):
        file = f"{slug}-step{snap.step}-{i}.svg"
        if i >= MAX_PICTURES:
            pictures.append(Picture(snap, file, None, f"not drawn: a report draws the first {MAX_PICTURES} snapshots"))
            continue
        full = drawn.get(snap.dot)
        focused = snap.focus if full is not None else None  # (the page shows the whole graph where it has no focus)
        error = failed.get(snap.dot) or (failed.get(focused) if focused else None)
        if error is not None:
            pictures.append(Picture(snap, file, None, str(error)))
            continue
        pictures.append(Picture(snap, file, full, None, drawn.get(focused) if focused else None))
    return pictures


def gallery_html(pictures: list[Picture], slug: str) -> str:
    if not pictures:
        return '<p class="empty">No graph snapshots were taken in this run.</p>'
    from .svg import DOT_MISSING_NOTICE

    missing = any(p.svg is None and p.error is None for p in pictures)
    notice = f'<p class="notice">{code_spans(DOT_MISSING_NOTICE)}</p>' if missing else ""
    figures = []
    for i, picture in enumerate(pictures):
        snap = picture.snapshot
        caption = html_attr(f"step {snap.step} — {snap.reason}")
        if picture.svg is None:
            failed = f'<p class="notice">{html_attr(picture.error)}</p>' if picture.error else ""
            dot = snap.dot if len(snap.dot) <= MAX_SHOWN_DOT else snap.dot[:MAX_SHOWN_DOT] + "\n… (cut)"
            body = f"{failed}<details><summary>DOT source</summary><pre>{html_text(dot)}</pre></details>"
        else:
            shown = picture.focus or picture.svg
            body = f'<div class="svgbox">{scoped_ids(shown, f"{slug}-{i}-")}</div>'
            what = "the whole graph" if picture.focus else "open the SVG"
            caption += f' · <a href="snapshots/{html_attr(picture.file)}">{what}</a>'
        figures.append(f'<figure class="snapshot">{body}<figcaption>{caption}</figcaption></figure>')
    return notice + '<div class="gallery">' + "".join(figures) + "</div>"


_CSS_COLOURS = {"lightblue": "#add8e6", "orange": "#ffa500", "darkolivegreen1": "#caff70", "gray95": "#f2f2f2",
                "white": "#fff", "red": "#ff0000"}  # fmt: skip


def legend_html() -> str:
    """The snapshots' legend, once per report (the snapshots in the page have none): each entry drawn
    as the drawings draw it, in HTML, so that it reads at any size."""
    from .dot import legend_entries

    entries = []
    for text, attrs in legend_entries():
        fill = _CSS_COLOURS.get(attrs.get("fillcolor", "lightgrey"), "#d3d3d3")
        style = [f"background:{fill}"]
        if "dashed" in attrs.get("style", ""):
            style.append("border-style:dashed;color:#666")
        if attrs.get("color"):
            style.append(f"border:2px solid {_CSS_COLOURS.get(attrs['color'], attrs['color'])}")
        if attrs.get("peripheries") == "2":
            style.append("border:3px double #000")
        if attrs.get("shape") == "plaintext":
            style = [f"color:{_CSS_COLOURS.get(attrs.get('fontcolor', ''), '#c00')};border:none;background:none"]
        entries.append(f'<span style="{";".join(style)}">{html_attr(" ".join(text.split()))}</span>')
    return f'<div class="legend"><strong>Legend</strong>{"".join(entries)}</div>'
