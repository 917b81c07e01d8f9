"""Snapshot pictures a reader can read: kept graphs counted past a few, carried edges labelled with the finding's
line, one arrow between a fold and a box, and a name with DOT's own characters shown as one label.

Real training loops under ``graphwatch.watch()``, their snapshots drawn by the real ``dot`` (to SVG as a report
draws them, and read back with ``dot -Tjson0``).
"""

from __future__ import annotations

import html
import json
import re
import subprocess
from pathlib import Path

import pytest
import torch
from torch import nn

import graphwatch
from graphwatch.rendering.kept import GRAPHS_DRAWN
from graphwatch.rendering.svg import dot_available, render_svg

pytestmark = pytest.mark.skipif(not dot_available(), reason="Graphviz `dot` is not installed")
WIDEST_PT = 864  # a picture this wide (12 inches) fits the report's column at its own size
SMALLEST_FONT_PT = 10  # the text of a picture, as drawn (its font size times the SVG's scale): never shrunk


def parse(source: str) -> tuple[dict[str, dict], list[tuple[str, str]]]:
    """Nodes (name -> attributes, the legend's left out) and edges (tail, head) as Graphviz reads ``source``."""
    done = subprocess.run(["dot", "-Tjson0"], input=source.encode(), capture_output=True, check=True)
    data = json.loads(done.stdout)
    objects = [obj for obj in data.get("objects", []) if "nodes" not in obj and "subgraphs" not in obj]
    names = {obj["_gvid"]: obj["name"] for obj in objects}
    nodes = {obj["name"]: obj for obj in objects if not obj["name"].startswith("legend")}
    return nodes, [(names[e["tail"]], names[e["head"]]) for e in data.get("edges", []) if names[e["tail"]] in nodes]


def svg_size(svg: str) -> tuple[float, float, float]:
    """(width, height, scale) of an SVG ``dot`` wrote: its size in points and how much its drawing is shrunk."""
    width, height = (float(v) for v in re.search(r'<svg width="([\d.]+)pt" height="([\d.]+)pt"', svg).groups())
    scale = float(re.search(r'class="graph" transform="scale\(([\d.]+)', svg)[1])
    return width, height, scale


def node_texts(svg: str) -> list[list[str]]:
    """The lines of text of each node of an SVG ``dot`` wrote, as a reader sees them."""
    starts = [(match.start(), match[1]) for match in re.finditer(r'<g id="\w+" class="(node|edge|cluster)">', svg)]
    ends = [start for start, _ in starts[1:]] + [len(svg)]
    return [[html.unescape(text) for text in re.findall(r"<text[^>]*>([^<]*)</text>", svg[start:end])]
            for (start, kind), end in zip(starts, ends) if kind == "node"]


def kept_picture(trace: graphwatch.Trace) -> str:
    return next(s for s in trace.snapshots if s.reason.startswith("kept alive by")).focus or ""


def validation_outputs_kept(steps: int) -> graphwatch.Trace:
    """A loop that keeps each step's validation output, with its graph (no ``torch.no_grad()``)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x_val = torch.randn(128, 16)
    outputs = []
    with graphwatch.watch(summary=False) as gw:
        for _ in range(steps):
            loss = nn.functional.mse_loss(model(torch.randn(32, 16)), torch.randn(32, 1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            outputs.append(model(x_val))
    return gw.trace


def total_loss_kept(steps: int) -> graphwatch.Trace:
    """A loop that sums its losses, graphs and all: one tensor keeps every step's graph."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    total_loss = 0
    with graphwatch.watch(summary=False) as gw:
        for _ in range(steps):
            loss = nn.functional.mse_loss(model(torch.randn(32, 16)), torch.randn(32, 1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            total_loss += loss
    return gw.trace


def assert_readable(source: str) -> None:
    svg = render_svg(source) or ""
    width, height, scale = svg_size(svg)
    fonts = {float(size) for size in re.findall(r'font-size="([\d.]+)"', svg)}
    assert width <= WIDEST_PT and height <= 2 * WIDEST_PT, (width, height)
    assert fonts and min(fonts) * scale >= SMALLEST_FONT_PT, (fonts, scale)


@pytest.mark.parametrize("steps", [8, 40])
def test_a_kept_list_picture_draws_a_few_graphs_counts_the_rest_and_stays_readable(steps: int) -> None:
    picture = kept_picture(validation_outputs_kept(steps))
    assert_readable(picture)
    nodes, edges = parse(picture)
    drawn = [name for name, node in nodes.items() if re.match(r"outputs\[\d+\]\n", node["label"])]
    (holder,) = [name for name, node in nodes.items() if node["label"] == "outputs\n(list)"]
    (more,) = [name for name, node in nodes.items() if node["label"].startswith("+")
               and "more graphs" in node["label"]]
    assert len(drawn) == GRAPHS_DRAWN and {(name, holder) for name in drawn} | {(holder, more)} <= set(edges)
    shown = len(drawn) + int(re.match(r"\+(\d+) more graphs of steps \d+\.\.\d+,\neach like the ones drawn$",
                                      nodes[more]["label"])[1])
    assert shown == min(steps, 8)  # (a kept-alive picture draws the last 8 outputs a list holds)


@pytest.mark.parametrize("steps", [8, 40])
def test_a_summed_loss_picture_stays_readable_however_many_steps_it_keeps(steps: int) -> None:
    picture = kept_picture(total_loss_kept(steps))
    assert_readable(picture)
    nodes, _ = parse(picture)
    folds = [node["label"] for node in nodes.values() if node["label"].startswith("+")]
    assert len(folds) <= 10, folds  # the steps with no node drawn are one fold, not one each
    if steps == 40:
        assert any(re.match(r"\+\d+ nodes of steps 0\.\.\d+", label) for label in folds), folds


def test_a_node_whose_line_was_inferred_names_no_line_when_hovered() -> None:
    """``total_loss += loss`` saves no tensor: its ``AddBackward0``'s line is read off the op before it (the loss's
    line), which is another line's; hovering the node names its op and step, never that line."""
    trace = total_loss_kept(4)
    nodes, _ = parse(kept_picture(trace))
    adds = [node["tooltip"] for node in nodes.values() if node["label"] == "AddBackward0"]
    assert any(", step " in tip for tip in adds), adds  # (the newest has no record yet: its label is its tooltip)
    assert all(re.fullmatch(r"AddBackward0(, step \d+)?", tip) for tip in adds), adds
    inferred = [n for n in trace.nodes.values() if n.op == "AddBackward0"]
    assert inferred and all(n.site_inferred for n in inferred)  # (what the drawing is honest about)
    losses = [node["tooltip"] for node in nodes.values() if node["label"].startswith("MseLossBackward0")]
    assert losses and all(" at " in tip and "test_kept_pictures.py:" in tip for tip in losses), losses


class Recurrent(nn.Module):
    """A recurrence whose carried node is made inside the model, not on the loop's line."""

    def __init__(self) -> None:
        super().__init__()
        self.enc, self.head = nn.Linear(8, 16), nn.Linear(16, 1)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        z = self.enc(x)
        return torch.tanh(z + h)  # the node's own line


def test_the_carried_edge_is_labelled_with_the_line_the_finding_cites() -> None:
    torch.manual_seed(0)
    model = Recurrent()
    with graphwatch.watch(summary=False) as gw:
        h = torch.zeros(4, 16)
        for _ in range(3):
            for _ in range(5):
                h = model(torch.randn(4, 8), h)  # the loop's line, which the finding cites
            model.head(h).pow(2).mean().backward(retain_graph=True)
    (finding,) = [f for f in gw.trace.findings if f.kind == "graph-carried-across-steps"]
    lines = Path(__file__).read_text().splitlines()
    loop_line = next(n for n, line in enumerate(lines, 1) if line.endswith("# the loop's line, which the finding cites"))
    assert finding.evidence["sites"][0].endswith(f"{Path(__file__).name}:{loop_line}")
    crossing = next(s for s in gw.trace.snapshots if s.reason == "graph crosses steps")
    for source in (crossing.dot, crossing.focus or ""):
        done = subprocess.run(["dot", "-Tjson0"], input=source.encode(), capture_output=True, check=True)
        red = [e for e in json.loads(done.stdout).get("edges", []) if e.get("color") == "red"]
        assert red and {e["label"] for e in red} == {finding.evidence["sites"][0]}


def test_between_a_fold_and_a_box_there_is_one_arrow() -> None:
    """An LSTM cell's state carried across steps: the fold of step 0 holds nodes both before and after the
    carried ``AddBackward0`` (``c = f * c + i * g``, then ``tanh(c)``); it is drawn with one arrow to it."""
    torch.manual_seed(0)
    cell, head = nn.LSTMCell(8, 32), nn.Linear(32, 1)
    opt = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=0.01)
    h, c = torch.zeros(16, 32), torch.zeros(16, 32)
    with pytest.raises(RuntimeError), graphwatch.watch(summary=False) as gw:
        for _ in range(4):
            opt.zero_grad()
            h, c = cell(torch.randn(16, 8), (h, c))
            head(h).pow(2).mean().backward(retain_graph=True)
            opt.step()
    crossing = next(s for s in gw.trace.snapshots if s.reason == "graph crosses steps")
    nodes, edges = parse(crossing.focus or "")
    folds = {name for name, node in nodes.items() if re.match(r"\+\d+ nodes of step", node["label"])}
    assert any(tail in folds and head == added for tail, head in edges
               for added in (n for n, node in nodes.items() if node["label"].startswith("AddBackward0\nstep 0")))
    both_ways = [(tail, head) for tail, head in edges if (head, tail) in edges]
    assert not both_ways, [(nodes[t]["label"], nodes[h]["label"]) for t, h in both_ways]


def test_a_module_named_with_dot_syntax_is_one_box_showing_its_name_literally() -> None:
    name = 'a"b\n]c\\'
    model = nn.Sequential()
    setattr(model, name, nn.Linear(3, 1, bias=False))
    with graphwatch.watch(summary=False) as gw:
        model(torch.ones(2, 3)).sum().backward()
    boxes = node_texts(render_svg(gw.trace.snapshots[0].dot) or "")
    assert [texts for texts in boxes if any("]c" in text for text in texts)] == [['model.a"b\\n]c\\.weight', " (1, 3)"]]
