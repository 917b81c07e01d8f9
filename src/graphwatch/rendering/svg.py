"""Render DOT source to SVG with Graphviz's ``dot`` program, ready to inline in HTML.

``dot`` is a system program (Debian: ``apt-get install graphviz``), not a
Python package: :func:`render_svg` returns None when it is missing, and
callers print :data:`DOT_MISSING_NOTICE` once instead of a picture.

The DOT may come from a trace someone else recorded: :func:`render_svg` draws
only what :func:`~graphwatch.rendering.dot_filter.filter_dot` keeps of it, and
:func:`clean_svg` writes Graphviz's SVG again from an allow-list of elements and
attributes (no link, no script, no style, no reference outside the picture),
so that what is inlined in a report is a drawing and nothing else.

Example::

    >>> from graphwatch.rendering.svg import dot_available, render_svg
    >>> svg = render_svg("digraph { a -> b }")
    >>> svg.startswith("<svg") if dot_available() else svg is None
    True
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from html import escape
from xml.etree import ElementTree

from ..errors import GraphwatchError
from .dot_filter import UnsafeDot, filter_dot
from .visible import visible

DOT_MISSING_NOTICE = (
    "graph pictures need Graphviz's `dot` program, which is not installed: "
    "apt-get install graphviz (macOS: brew install graphviz)"
)


class DotError(GraphwatchError, RuntimeError):
    """``dot`` failed on a graph or took longer than the timeout."""


def dot_available() -> bool:
    """True when Graphviz's ``dot`` program is on the PATH."""
    return shutil.which("dot") is not None


def render_svg(dot_source: str, timeout: float = 30) -> str | None:
    """The SVG of ``dot_source`` (what :func:`~graphwatch.rendering.dot_filter.filter_dot` keeps of it) as
    :func:`clean_svg` writes it, or None if ``dot`` is missing.

    Raises :class:`DotError` when the source is not the kind of DOT graphwatch writes, when ``dot`` rejects it
    or runs longer than ``timeout`` seconds (a huge graph: draw it with ``max_nodes``).
    """
    program = shutil.which("dot")
    return None if program is None else _drawing(_laid_out(program, [_filtered(dot_source)], timeout)[0])


def render_svgs(dot_sources: Sequence[str], timeout: float = 30) -> list[str | DotError] | None:
    """:func:`render_svg` of each of ``dot_sources``, in order, each an SVG or the :class:`DotError` it raises;
    None if ``dot`` is missing.  One ``dot`` process lays them all out (a report's pictures: starting ``dot``
    costs more than laying out a small graph); where that process fails or runs longer than ``timeout``, each
    graph is laid out alone, so that each gets its own picture or error.

    >>> pictures = render_svgs(["digraph { a -> b }", "digraph { a -> }", "digraph { c }"])
    >>> [type(p).__name__ for p in pictures] if dot_available() else pictures
    ['str', 'DotError', 'str']
    """
    program = shutil.which("dot")
    if program is None:
        return None
    results: dict[int, str | DotError] = {}
    filtered: dict[int, str] = {}
    for i, source in enumerate(dot_sources):
        try:
            filtered[i] = _filtered(source)
        except DotError as exc:
            results[i] = exc
    try:
        together = _laid_out(program, list(filtered.values()), timeout) if len(filtered) > 1 else None
    except DotError:  # one graph dot rejects (or a slow one) stops the whole run: each alone below
        together = None
    for n, (i, source) in enumerate(filtered.items()):
        try:
            results[i] = _drawing(together[n] if together is not None else _laid_out(program, [source], timeout)[0])
        except DotError as exc:
            results[i] = exc
    return [results[i] for i in range(len(dot_sources))]


def _filtered(dot_source: str) -> str:
    """What :func:`~graphwatch.rendering.dot_filter.filter_dot` keeps of ``dot_source``, or :class:`DotError`."""
    try:
        return filter_dot(dot_source)
    except UnsafeDot as exc:
        raise DotError(f"could not render the graph: {exc}") from None


def _laid_out(program: str, sources: list[str], timeout: float) -> list[str]:
    """Graphviz's SVG of each of ``sources`` (filtered graphs), laid out by one ``dot`` process: one document
    each, in order; :class:`DotError` when ``dot`` fails or runs longer than ``timeout`` seconds."""
    try:
        done = subprocess.run(
            [program, "-Tsvg"], input="\n".join(sources).encode("utf-8"), capture_output=True, timeout=timeout,
            check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise DotError(f"dot took longer than {timeout:g} s to lay out the graph; draw fewer nodes") from exc
    documents = done.stdout.decode("utf-8", errors="replace").split("<?xml ")[1:]  # (text has its "<" escaped)
    if done.returncode != 0 or len(documents) != len(sources) or not all("<svg" in d for d in documents):
        message = done.stderr.decode("utf-8", errors="replace").strip() or f"exit status {done.returncode}"
        raise DotError(f"dot could not render the graph: {visible(message)}")
    # (a graph after the first has its group named as a page of several: named as when laid out alone)
    return [_PAGE_GROUP.sub("", document[document.find("<svg") :], count=1) for document in documents]


_PAGE_GROUP = re.compile(r'(?<=<g id=")page\d+,\d+_(?=graph\d+")')


def _drawing(svg: str) -> str:
    """Graphviz's SVG of one graph as a report inlines it (:func:`clean_svg`, :func:`readable_titles`)."""
    return readable_titles(clean_svg(svg))


_SVG, _XLINK = "{http://www.w3.org/2000/svg}", "{http://www.w3.org/1999/xlink}"
_ELEMENTS = frozenset({"svg", "g", "title", "polygon", "polyline", "path", "ellipse", "text", "a"})
_COLOUR = re.compile(r"#[0-9A-Fa-f]{3,8}|[A-Za-z]{1,30}")
_PLAIN_ATTRIBUTES = frozenset({
    "id", "class", "width", "height", "viewBox", "transform", "points", "d", "cx", "cy", "rx", "ry", "x", "y",
    "stroke-width", "stroke-dasharray", "stroke-opacity", "fill-opacity", "text-anchor", "font-family", "font-size",
    "font-weight", "font-style", "text-decoration", "preserveAspectRatio",
})  # fmt: skip
_COLOUR_ATTRIBUTES = frozenset({"fill", "stroke"})


def clean_svg(svg: str) -> str:
    """Graphviz's SVG written again from an allow-list: its shapes, text and hover titles (``xlink:title``),
    nothing else (no ``href``, ``style``, event handler, script or foreign element; a colour is a colour).

    >>> clean_svg('<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink">'
    ...           '<a xlink:href="javascript:alert(1)" xlink:title="x"><text onclick="alert(2)">hi</text></a>'
    ...           '<script>alert(3)</script></svg>')
    '<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink"><a xlink:title="x"><text>hi</text></a></svg>'
    """
    try:
        root = ElementTree.fromstring(svg)
    except ElementTree.ParseError as exc:
        raise DotError(f"dot wrote an SVG that does not parse ({exc}); the picture is left out") from None
    if root.tag != _SVG + "svg":
        raise DotError("dot wrote something other than an SVG; the picture is left out")
    out: list[str] = []
    _write(root, out, top=True)
    return "".join(out)


def _write(element: ElementTree.Element, out: list[str], top: bool = False) -> None:
    tag = element.tag[len(_SVG) :] if isinstance(element.tag, str) and element.tag.startswith(_SVG) else None
    if tag in _ELEMENTS:
        attributes = [
            f' {name}="{escape(visible(value))}"'
            for key, value in element.attrib.items()
            if (name := _allowed(key, value)) is not None
        ]
        if top:
            attributes.append(f' xmlns="{_SVG[1:-1]}" xmlns:xlink="{_XLINK[1:-1]}"')
        out.append(f"<{tag}{''.join(attributes)}")
        if element.text or len(element):
            out.append(">" + escape(visible(element.text or ""), quote=False))
            for child in element:
                _write(child, out)
            out.append(f"</{tag}>")
        else:
            out.append("/>")
    if element.tail and not top:
        out.append(escape(visible(element.tail), quote=False))


def _allowed(key: str, value: str) -> str | None:
    """The name to write an attribute under, or None to leave it out."""
    if key == _XLINK + "title":
        return "xlink:title"
    if key in _PLAIN_ATTRIBUTES:
        return key
    if key in _COLOUR_ATTRIBUTES and _COLOUR.fullmatch(value):
        return key
    return None


_TITLED = re.compile(r'<title>[^<]*</title>(\s*<g id="a_[^"]*"><a xlink:title="([^"]*)">)')
_UNTITLED = re.compile(r'<title>[^<]*</title>\n?(?!\s*<g id="a_)')


def readable_titles(svg: str) -> str:
    """Hover titles that say something: a node's or edge's ``tooltip`` replaces Graphviz's own title
    (``n5``, ``n5->n3``), and the titles of what has no tooltip (``%3``, the legend) are dropped.

    >>> readable_titles('<g><title>n0</title><g id="a_n0"><a xlink:title="Exp at a.py:3">x</a></g></g>')
    '<g><title>Exp at a.py:3</title><g id="a_n0"><a xlink:title="Exp at a.py:3">x</a></g></g>'
    >>> readable_titles("<g><title>%3</title><polygon/></g>")
    '<g><polygon/></g>'
    """
    return _UNTITLED.sub("", _TITLED.sub(lambda m: f"<title>{m[2]}</title>{m[1]}", svg))
