"""A snapshot's DOT, read as untrusted data and written again from an allow-list before Graphviz sees it.

A trace stores each snapshot as DOT text, and a trace can come from anyone
(``graphwatch report THEIR_TRACE.json``).  DOT can do more than draw boxes:
``URL``/``href`` make links (``javascript:`` ones too) in the SVG that is
inlined into the report, ``image``, ``shapefile`` and ``fontpath`` make Graphviz
read files from the disk of whoever renders it, HTML-like labels carry links
of their own, and ``peripheries=100000`` or a huge ``size`` makes a picture
that takes minutes to draw.  :func:`filter_dot` parses the subset of DOT that
graphwatch writes (a ``digraph`` of nodes, edges, attribute statements and
subgraphs) and writes it out again keeping only the attributes a snapshot uses,
each value checked against what it may be; text (labels, tooltips) is kept as
text, its hidden characters made visible.  Anything else is dropped, and DOT it
cannot parse raises :class:`UnsafeDot`.

Example::

    >>> print(filter_dot('digraph { n0 [label="x" URL="javascript:alert(1)" fillcolor=orange] n0 -> n1 }'))
    digraph {
    n0 [label="x" fillcolor="orange"]
    n0 -> n1
    }
    >>> filter_dot('digraph { n0 [label=<<b>x</b>>] }')
    Traceback (most recent call last):
    ...
    graphwatch.rendering.dot_filter.UnsafeDot: the snapshot's DOT is not the kind graphwatch writes: an HTML-like label at line 1
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from ..errors import GraphwatchError
from .visible import visible

MAX_DOT_CHARS = 2 * 2**20  # a session's snapshot is at most a few hundred boxes: well under this
MAX_STATEMENTS = 20_000
MAX_DEPTH = 8  # subgraphs inside subgraphs
MAX_TEXT_CHARS = 4000  # a label or tooltip longer than this is cut


class UnsafeDot(GraphwatchError, ValueError):
    """A snapshot's DOT that is not the kind graphwatch writes (so it is not drawn)."""


_TOKEN = re.compile(
    r"""(?P<space>[ \t\r\n]+)
      | (?P<arrow>->|--)
      | (?P<punct>[{}\[\]=;,])
      | (?P<quoted>"(?:\\.|[^"\\])*")
      | (?P<id>[A-Za-z_][A-Za-z_0-9]*|-?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?))
      | (?P<html><)
      | (?P<other>.)""",
    re.VERBOSE | re.DOTALL,
)
_KEYWORDS = {"graph", "digraph", "subgraph", "node", "edge", "strict"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9]{0,63}")


def _one_of(*allowed: str) -> Callable[[str], str | None]:
    return lambda value: value if value in allowed else None


def _number(low: float, high: float) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        try:
            number = float(value)
        except ValueError:
            return None
        return value if re.fullmatch(r"-?[0-9]{0,6}(\.[0-9]{0,20})?", value) and low <= number <= high else None

    return check


def _colour(value: str) -> str | None:
    return value if re.fullmatch(r"#[0-9A-Fa-f]{6}([0-9A-Fa-f]{2})?|[A-Za-z][A-Za-z0-9]{0,30}", value) else None


def _size(value: str) -> str | None:
    return value if re.fullmatch(r"[0-9]{1,4}(\.[0-9]{0,20})?,[0-9]{1,4}(\.[0-9]{0,20})?!?", value) else None


def _style(value: str) -> str | None:
    parts = value.split(",")
    allowed = {"filled", "dashed", "dotted", "bold", "invis", "solid", "rounded", ""}
    return value if len(parts) <= 4 and all(part.strip() in allowed for part in parts) else None


def _font(value: str) -> str | None:
    return value if re.fullmatch(r"[A-Za-z0-9 ._-]{1,40}", value) else None


def _text(value: str) -> str | None:
    return visible(value if len(value) <= MAX_TEXT_CHARS else value[: MAX_TEXT_CHARS - 1] + "…")


# Every attribute a snapshot may carry, and what its value may be.  Not here, so never drawn: URL, href,
# target, id, class, image, imagepath, shapefile, fontpath, stylesheet and every other one.
ATTRIBUTES: dict[str, Callable[[str], str | None]] = {
    "label": _text, "tooltip": _text, "xlabel": _text,
    "fillcolor": _colour, "color": _colour, "fontcolor": _colour, "bgcolor": _colour,
    "style": _style, "fontname": _font,
    "shape": _one_of("box", "rect", "rectangle", "square", "note", "plaintext", "plain", "none", "ellipse", "oval",
                     "circle", "doublecircle", "diamond", "folder", "tab", "component", "cylinder", "box3d"),
    "fontsize": _number(1, 72), "penwidth": _number(0, 10), "peripheries": _one_of("0", "1", "2", "3"),
    "height": _number(0, 20), "width": _number(0, 20), "ranksep": _number(0, 10), "nodesep": _number(0, 10),
    "arrowsize": _number(0, 5), "margin": _number(0, 5), "size": _size,
    "align": _one_of("left", "center", "right"), "labeljust": _one_of("l", "r", "c"),
    "labelloc": _one_of("t", "b", "c"), "rankdir": _one_of("TB", "LR", "BT", "RL"),
    "rank": _one_of("same", "min", "max", "source", "sink"), "dir": _one_of("forward", "back", "both", "none"),
    "arrowhead": _one_of("normal", "none", "vee", "dot", "odot", "empty", "inv", "tee", "open", "diamond"),
    "arrowtail": _one_of("normal", "none", "vee", "dot", "odot", "empty", "inv", "tee", "open", "diamond"),
    "constraint": _one_of("true", "false"), "splines": _one_of("true", "false", "line", "ortho", "polyline", "curved"),
}  # fmt: skip


class _Tokens:
    """The DOT tokens of a source, with the line each is on, read one ahead (never all held at once)."""

    _END = ("end", "", -1)

    def __init__(self, source: str) -> None:
        self._items = self._scan(source)
        self._next = next(self._items, self._END)

    @staticmethod
    def _scan(source: str) -> Iterator[tuple[str, str, int]]:
        line = 1
        for match in _TOKEN.finditer(source):
            kind, text = match.lastgroup or "", match[0]
            if kind == "html":
                raise UnsafeDot(f"the snapshot's DOT is not the kind graphwatch writes: an HTML-like label at line {line}")
            if kind == "other":
                raise UnsafeDot(f"the snapshot's DOT is not the kind graphwatch writes: {visible(text)!r} at line {line}")
            if kind != "space":
                yield kind, text, line
            line += text.count("\n")

    def peek(self) -> tuple[str, str]:
        return self._next[0], self._next[1]

    def take(self, *expected: str) -> str:
        """The next token's text; UnsafeDot unless it is one of ``expected`` (token kinds or exact texts)."""
        kind, text, line = self._next
        if expected and kind not in expected and text not in expected:
            where = "at the end" if line < 0 else f"at line {line}"
            raise UnsafeDot(f"the snapshot's DOT is not the kind graphwatch writes: {visible(text)!r} {where}")
        self._next = next(self._items, self._END)
        return text


def _value(token: str) -> str:
    """An ID or quoted string's value as text: ``\\"`` and ``\\\\`` read as DOT reads them, ``\\n``, ``\\l``
    and ``\\r`` as line breaks, a backslash before anything else kept."""
    if not token.startswith('"'):
        return token
    return re.sub(r'\\(["\\nlr])', lambda m: "\n" if m[1] in "nlr" else m[1], token[1:-1])


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class _Writer:
    """Parses the graphwatch subset of DOT from tokens and writes the allowed part of it."""

    def __init__(self, tokens: _Tokens) -> None:
        self.tokens = tokens
        self.out: list[str] = []
        self.statements = 0

    def graph(self) -> str:
        tokens = self.tokens
        if tokens.peek()[1] == "strict":
            tokens.take()
        tokens.take("digraph")
        if tokens.peek()[0] in ("id", "quoted"):
            tokens.take()
        self.out.append("digraph {")
        self.body(0)
        tokens.take("end")
        self.out.append("}")
        return "\n".join(self.out)

    def body(self, depth: int) -> None:
        tokens = self.tokens
        tokens.take("{")
        while tokens.peek()[1] != "}":
            self.statements += 1
            if self.statements > MAX_STATEMENTS:
                raise UnsafeDot(f"the snapshot has more than {MAX_STATEMENTS:,} statements: too large to draw")
            self.statement(depth)
            while tokens.peek()[1] in (";", ","):
                tokens.take()
        tokens.take("}")

    def statement(self, depth: int) -> None:
        tokens = self.tokens
        text = tokens.peek()[1]
        if text == "subgraph" or text == "{":
            if depth >= MAX_DEPTH:
                raise UnsafeDot(f"the snapshot nests subgraphs more than {MAX_DEPTH} deep")
            name = ""
            if text == "subgraph":
                tokens.take()
                if tokens.peek()[0] in ("id", "quoted"):
                    name = _value(tokens.take())
            self.out.append("subgraph " + (f"{name} " if _NAME.fullmatch(name) else "") + "{")
            self.body(depth + 1)
            self.out.append("}")
            return
        if text in ("graph", "node", "edge"):
            tokens.take()
            self.out.append(f"{text}{self.attributes()}")
            return
        name = _value(tokens.take("id", "quoted"))
        if tokens.peek()[1] == "=":  # a graph attribute: label="..."
            tokens.take()
            kept = self._kept(name, _value(tokens.take("id", "quoted")))
            if kept:
                self.out.append(kept)
            return
        chain = [self._node_name(name)]
        while tokens.peek()[0] == "arrow":
            tokens.take()
            chain.append(self._node_name(_value(tokens.take("id", "quoted"))))
        self.out.append(" -> ".join(chain) + self.attributes())

    @staticmethod
    def _node_name(name: str) -> str:
        if not _NAME.fullmatch(name) or name in _KEYWORDS:
            raise UnsafeDot(f"the snapshot's DOT is not the kind graphwatch writes: a node named {visible(name)!r}")
        return name

    def attributes(self) -> str:
        tokens = self.tokens
        kept = []
        while tokens.peek()[1] == "[":
            tokens.take()
            while tokens.peek()[1] != "]":
                key = _value(tokens.take("id", "quoted"))
                tokens.take("=")
                value = _value(tokens.take("id", "quoted"))
                if (attribute := self._kept(key, value)) is not None:
                    kept.append(attribute)
                while tokens.peek()[1] in (";", ","):
                    tokens.take()
            tokens.take("]")
        return f" [{' '.join(kept)}]" if kept else ""

    @staticmethod
    def _kept(key: str, value: str) -> str | None:
        check = ATTRIBUTES.get(key)
        checked = None if check is None else check(value)
        return None if checked is None else f"{key}={_quoted(checked)}"


def filter_dot(source: str) -> str:
    """``source`` (a snapshot's DOT, from a trace) parsed and written again with only the allowed attributes and
    values (:data:`ATTRIBUTES`); :class:`UnsafeDot` when it is not the kind of DOT graphwatch writes."""
    if len(source) > MAX_DOT_CHARS:
        raise UnsafeDot(f"the snapshot's DOT is {len(source):,} characters long: too large to draw")
    return _Writer(_Tokens(source)).graph()
