"""DOT statements written as text: the lines the ``graphviz`` package writes, without its cost per call.

A session draws its snapshots inside the user's training step, where the ``graphviz``
package's per-call wrappers, quoting and attribute sorting cost more than the rest of
the drawing.  This module writes the same bytes directly: :func:`quote` is
``graphviz.quoting.quote`` for a string that is never HTML-like (``graphviz.nohtml``),
:func:`text` is how every label and tooltip is written (untrusted text shown as it is),
and :func:`node`, :func:`edge`, :func:`subgraph` and :func:`digraph` are
``Digraph.node``, ``.edge``, ``.subgraph`` and ``.source`` (``tests/test_dot_writer.py``
holds them to it).

Example::

    >>> source = digraph([node("n0", "held\\\\", {"fillcolor": "#ffe4bf"}), edge("n0", "n1", {"dir": "none"})],
    ...                  {"size": "12,12"}, {"shape": "box"})
    >>> print(source, end="")  # doctest: +NORMALIZE_WHITESPACE
    digraph {
        graph [size="12,12"]
        node [shape=box]
        n0 [label="held\\\\" fillcolor="#ffe4bf"]
        n0 -> n1 [dir=none]
    }
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache

from .visible import visible

# graphviz.quoting's: what is written without quotes (a name or a number; ``$`` also matches before a final
# newline, as there), the words that must be quoted, and a double quote with the backslashes before it (an
# escaped ``\"`` is written as ``"`` is).
_ID = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*|-?(\.[0-9]+|[0-9]+(\.[0-9]*)?))$")
_KEYWORDS = frozenset({"node", "edge", "graph", "digraph", "subgraph", "strict"})
_QUOTE = re.compile(r'(?P<escaped_backslashes>(?:\\{2})*)\\?(?P<literal_quote>")')

TEXT_ATTRIBUTES = frozenset({"label", "tooltip", "xlabel"})  # what the user's code spells: written by text()


def quote(value: str) -> str:
    """``value`` as a DOT ID: as it is when it is a name or a number, else double-quoted, never HTML-like.

    >>> quote("lightblue"), quote("0.2"), quote("filled,dashed"), quote("node"), quote("<b>")
    ('lightblue', '0.2', '"filled,dashed"', '"node"', '"<b>"')
    """
    if _ID.match(value) and value.lower() not in _KEYWORDS:
        return value
    if '"' in value:
        value = _QUOTE.sub(r"\g<escaped_backslashes>\\\g<literal_quote>", value)
    return f'"{value}"'


def text(value: str) -> str:
    """``value`` (a name, a line, a file name: anything the user's code spells) as a DOT string that shows it
    as it is: hidden characters made visible (:func:`~graphwatch.rendering.visible.visible`: ESC would make
    the SVG ill-formed), backslashes doubled (DOT reads ``\\"``, ``\\l`` and a final ``\\`` as its own),
    quotes escaped, never an HTML-like label (``<...>``).

    >>> print(text('held\\\\'), text("<b>x</b>"), text('say "hi"'), text("\\x1b[31m"))
    "held\\\\" "<b>x</b>" "say \\"hi\\"" "\\\\u{1b}[31m"
    """
    return quote(visible(value).replace("\\", "\\\\"))


@lru_cache(maxsize=4096)  # a drawing repeats its tooltips and colours, the focused one the whole one's labels
def _pair(key: str, value: str) -> str:
    """``key=value``; labels, tooltips and xlabels as :func:`text`."""
    return f"{quote(key)}={text(value) if key in TEXT_ATTRIBUTES else quote(value)}"


def _a_list(attrs: Mapping[str, str]) -> str:
    """``key=value ...`` of every attribute, by name (a graph's or a subgraph's attribute statement)."""
    return " ".join([_pair(key, value) for key, value in sorted(attrs.items())])


def attr_list(attrs: Mapping[str, str], label: str | None = None) -> str:
    """`` [label=... key=value ...]`` (empty without attributes): the label (``label``, else ``attrs``'s) first,
    the others by name, as ``Digraph.node(name, label, **attrs)`` and ``Digraph.edge(tail, head, **attrs)``
    write them.

    >>> attr_list({"tooltip": "a b", "label": "x", "dir": "none"}), attr_list({})
    (' [label=x dir=none tooltip="a b"]', '')
    """
    pairs = [_pair(key, value) for key, value in sorted(attrs.items()) if key != "label"]
    if label is not None or (label := attrs.get("label")) is not None:
        pairs.insert(0, _pair("label", label))
    return f" [{' '.join(pairs)}]" if pairs else ""


def node(name: str, label: str, attrs: Mapping[str, str]) -> str:
    """A node statement line; ``name`` is graphwatch's own (``n0``, ``legend3``): written as it is."""
    return f"\t{name}{attr_list(attrs, label)}\n"


def edge(tail: str, head: str, attrs: Mapping[str, str]) -> str:
    """An edge statement line between two of graphwatch's node names."""
    return f"\t{tail} -> {head}{attr_list(attrs)}\n"


def subgraph(name: str, attrs: Mapping[str, str], body: Iterable[str]) -> list[str]:
    """The lines of a named subgraph with graph attributes ``attrs``, indented into its parent's body."""
    head = [f"\tsubgraph {name} {{\n"] + ([f"\t\t{_a_list(attrs)}\n"] if attrs else [])
    return [*head, *(f"\t{line}" for line in body), "\t}\n"]


def digraph(body: Sequence[str], graph_attrs: Mapping[str, str], node_attrs: Mapping[str, str]) -> str:
    """The whole source: the head, the graph's and the nodes' attributes (when there are any), ``body``'s lines."""
    head = [f"\t{kind} [{_a_list(attrs)}]\n" for kind, attrs in (("graph", graph_attrs), ("node", node_attrs)) if attrs]
    return "".join(["digraph {\n", *head, *body, "}\n"])
