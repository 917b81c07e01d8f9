"""graphwatch.rendering.dot_writer writes the DOT the ``graphviz`` package wrote, byte for byte, on hostile text.

The reference is the real ``graphviz`` package: its ``quote`` on what graphwatch gave it before (every label,
tooltip and xlabel as ``nohtml(visible(text) with backslashes doubled)``, every other value as it is) and its
``Digraph`` statements.  The golden snapshots were written by graphwatch when it still drew through ``graphviz``.
"""

from __future__ import annotations

import os
import random
import re
import warnings
from pathlib import Path

import graphviz
import pytest
import torch
from graphviz.quoting import quote as graphviz_quote

from graphwatch.model import Trace
from graphwatch.rendering import dot_writer
from graphwatch.rendering.dot import legend_entries, snapshot_dots
from graphwatch.rendering.graph_items import FADED, NODE_ATTR
from graphwatch.rendering.visible import visible

GOLDEN = Path(__file__).parent / "golden"
UPDATE_GOLDEN = os.environ.get("GRAPHWATCH_UPDATE_GOLDEN") == "1"

# What DOT, Graphviz's escString, HTML-like labels, a terminal or the SVG file would read as their own.
HOSTILE = [
    "", "held\\", "\\", "\\\\", "\\\\\\", 'held\\"\\l<b>', '"', '\\"', '\\\\"', '""', 'a\\\\\\"b', "\\l\\n\\r\\N\\G",
    "<b>x</b>", "<<b>x</b>>", "<x>\n", "<", ">", "a\nb", "abc\n", "a\r\nb", "t\tab", "node", "Node", "EDGE",
    "strict", "12", "-.5", "1.2.3", "-", "_ok", "a:b:c", "a b", "a;b", "a{b}[c]=d", "held\x1b[31m\x07", "x\u202ey",
    "\u2066x\u2069", "tr\udcc3\udca4in", "x\udcff", "\x00\x7f\x85", "\u2028\ufeff\ufffe", "שלום", "\U0001f600",
    "ünïcödé", "ÿ\u00a0", "lightblue", "filled,dashed", "#ffe4bf", "12,12",
]
ALPHABET = ['"', "\\", "<", ">", "\n", "\r", "\t", " ", "a", "Z", "_", "0", "9", ".", "-", ":", ";", ",", "=", "{", "}",
            "[", "]", "\x1b", "\x00", "\u202e", "\udcc3", "é", "\U0001f600", "l", "N"]


def fuzzed(count: int = 3000) -> list[str]:
    """Strings of up to 8 characters DOT quoting cares about, the same ones every run."""
    rng = random.Random(25)
    return [
        "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 8))) for _ in range(count)
    ]


def graphviz_text(value: str) -> str:
    """How graphwatch wrote a label before: ``graphviz.quoting.quote(nohtml(visible(value)`` with backslashes
    doubled``))``."""
    return graphviz_quote(graphviz.nohtml(visible(value).replace("\\", "\\\\")))


def graphviz_attrs(attrs: dict[str, str]) -> dict[str, str]:
    """What graphwatch passed ``Digraph.node`` / ``.edge`` as keyword attributes before."""
    return {key: graphviz.nohtml(visible(value).replace("\\", "\\\\")) if key in dot_writer.TEXT_ATTRIBUTES
            else value for key, value in attrs.items()}


@pytest.mark.parametrize("corpus", ["hostile", "fuzzed"])
def test_quote_is_graphviz_quote_of_a_string_never_read_as_html(corpus):
    strings = HOSTILE if corpus == "hostile" else fuzzed()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # graphviz warns of a final odd backslash; the quoting is still compared
        expected = [graphviz_quote(graphviz.nohtml(s)) for s in strings]
    assert [dot_writer.quote(s) for s in strings] == expected


@pytest.mark.parametrize("corpus", ["hostile", "fuzzed"])
def test_text_is_what_graphviz_wrote_and_one_dot_token_showing_the_visible_text(corpus):
    strings = HOSTILE if corpus == "hostile" else fuzzed()
    assert [dot_writer.text(s) for s in strings] == [graphviz_text(s) for s in strings]
    for s in strings:
        written = dot_writer.text(s)
        # one DOT token: an ID, or a quoted string whose only escapes are \" and \\ (as DOT and its escString
        # read them back: the visible text)
        assert re.fullmatch(r'[A-Za-z_0-9.\-]+\n?|"(?:\\.|[^"\\])*"', written), written
        body = written[1:-1] if written.startswith('"') else written
        assert re.sub(r'\\(["\\])', r"\1", body) == visible(s)


def test_every_value_graphwatch_writes_unescaped_is_quoted_as_graphviz_did():
    constants = [*NODE_ATTR.items(), *FADED.items(), ("size", "12,12"), ("size", "35.85,35.85"), ("dir", "none"),
                 ("style", "dotted"), ("style", "invis"), ("style", "bold"), ("penwidth", "2"), ("peripheries", "2"),
                 *((key, value) for _, attrs in legend_entries() for key, value in attrs.items())]
    for key, value in constants:
        assert dot_writer.quote(key) == graphviz_quote(key) and dot_writer.quote(value) == graphviz_quote(value)
    for label, _ in legend_entries():  # the legend's labels were given to graphviz as they are
        assert dot_writer.text(label) == graphviz_quote(label)


@pytest.mark.parametrize("label", HOSTILE)
def test_node_and_edge_lines_are_digraphs(label):
    attrs = {"fillcolor": "#ffe4bf", "tooltip": label + " tip", "xlabel": label, **FADED}
    reference = graphviz.Digraph()
    reference.node("n0", graphviz.nohtml(visible(label).replace("\\", "\\\\")), **graphviz_attrs(attrs))
    reference.edge("n0", "n1", **graphviz_attrs({"label": label, "color": "red", "tooltip": "a → b"}))
    reference.edge("n1", "n2")
    written = [dot_writer.node("n0", label, attrs), dot_writer.edge("n0", "n1", {"label": label, "color": "red",
               "tooltip": "a → b"}), dot_writer.edge("n1", "n2", {})]
    assert written == reference.body


def test_subgraph_and_whole_source_are_digraphs():
    reference = graphviz.Digraph(node_attr=NODE_ATTR, graph_attr={"size": "13.5,13.5"})
    reference.node("n0", "x")
    with reference.subgraph(name="cluster_legend") as legend:
        legend.attr(label="graphwatch legend", fontsize="10", style="dashed")
        legend.node("legend0", "a\nb", fillcolor="lightblue")
        legend.edge("legend0", "legend1", style="invis")
    lines = [dot_writer.node("legend0", "a\nb", {"fillcolor": "lightblue"}),
             dot_writer.edge("legend0", "legend1", {"style": "invis"})]
    body = [dot_writer.node("n0", "x", {}),
            *dot_writer.subgraph("cluster_legend", {"label": "graphwatch legend", "fontsize": "10", "style": "dashed"},
                                 lines)]
    assert dot_writer.digraph(body, {"size": "13.5,13.5"}, NODE_ATTR) == reference.source


NAMES = ["held\\", "held\x1b[31m\x07", 'held\\"\\l<b>', "<b>x</b>", "x\u202ey", "tr\udcc3\udca4in", "node", "12",
         "abc\n", "\\l\\n\\r", "\\\\\"", "שלום\t\U0001f600", "\x00\x7f\x85\u2028\ufeff"]


def hostile_snapshot() -> tuple[str, str]:
    """The (whole, focused) snapshot of a graph whose parameters, outputs, holders, notes and custom op carry
    every kind of string DOT or a terminal reads as its own; half of it freed by a backward."""
    custom = type('Odd"op\\<i>', (torch.autograd.Function,), {
        "forward": staticmethod(lambda ctx, x: (ctx.save_for_backward(x), x * 2)[1]),
        "backward": staticmethod(lambda ctx, grad: grad * 2),
    })
    params = {name: torch.full((2, k + 1), 0.5, requires_grad=True) for k, name in enumerate(NAMES)}
    first = sum(custom.apply(p.exp()).sum() for p in list(params.values())[:6])
    second = sum((p * 3).tanh().sum() for p in list(params.values())[6:])
    first.backward(retain_graph=False)
    outputs = {"kept[0]": first, "kept[1]": second, 'box["a\\"<i>"]': second * 2}
    notes = {"kept[0]": 'keeps "step 3" \\l<b>\x1b]0;x\x07', 'box["a\\"<i>"]': "held\\"}
    return snapshot_dots([first.grad_fn, second.grad_fn], Trace(), 0, params=params, outputs=outputs, notes=notes)


def test_snapshot_of_hostile_names_is_the_dot_graphviz_wrote():
    for source, name in zip(hostile_snapshot(), ["snapshot_hostile.dot", "snapshot_hostile_focus.dot"]):
        path = GOLDEN / name
        if UPDATE_GOLDEN:
            path.write_text(source, encoding="utf-8")
        assert source == path.read_text(encoding="utf-8"), f"{name} changed; GRAPHWATCH_UPDATE_GOLDEN=1 rewrites it"
