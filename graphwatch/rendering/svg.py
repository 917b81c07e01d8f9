"""Render DOT source to SVG with Graphviz's ``dot`` program, ready to inline in HTML.

``dot`` is a system program (Debian: ``apt-get install graphviz``), not a
Python package: :func:`render_svg` returns None when it is missing, and
callers print :data:`DOT_MISSING_NOTICE` once instead of a picture.

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

from ..errors import GraphwatchError

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
    """The SVG of ``dot_source`` without its XML prolog and doctype, or None if ``dot`` is missing.

    Raises :class:`DotError` when ``dot`` rejects the source or runs longer
    than ``timeout`` seconds (a huge graph: draw it with ``max_nodes``).
    """
    program = shutil.which("dot")
    if program is None:
        return None
    try:
        done = subprocess.run(
            [program, "-Tsvg"], input=dot_source.encode(), capture_output=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise DotError(f"dot took longer than {timeout:g} s to lay out the graph; draw fewer nodes") from exc
    svg = done.stdout.decode("utf-8", errors="replace")
    start = svg.find("<svg")
    if done.returncode != 0 or start < 0:
        message = done.stderr.decode("utf-8", errors="replace").strip() or f"exit status {done.returncode}"
        raise DotError(f"dot could not render the graph: {message}")
    return readable_titles(svg[start:])


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
