"""Graph snapshots: graphwatch.rendering.dot and .svg, with real torch, real graphviz and real ``dot``.

Structures are compared through ``dot -Tjson0`` (Graphviz merges repeated node statements the way
it draws them) and matched by shape, not by node names: torchviz names nodes by ``id()``.
"""

from __future__ import annotations

import doctest
import json
import os
import re
import subprocess
import sys
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from dot_calls import dot_that_keeps_its_input
from torch.utils.checkpoint import checkpoint

import graphwatch
from graphwatch.capture.graph.graph_walk import node_record
from graphwatch.rendering import dot as dot_module
from graphwatch.rendering import svg as svg_module
from graphwatch.rendering.dot import make_dot, snapshot_dot
from graphwatch.rendering.svg import DOT_MISSING_NOTICE, DotError, dot_available, render_svg, render_svgs

GOLDEN = Path(__file__).parent / "golden"
UPDATE_GOLDEN = os.environ.get("GRAPHWATCH_UPDATE_GOLDEN") == "1"
needs_dot = pytest.mark.skipif(not dot_available(), reason=DOT_MISSING_NOTICE)


# ----------------------------------------------------------------------------- helpers
def parse(source: str) -> tuple[dict[str, dict], list[tuple[str, str, dict]]]:
    """Nodes (name -> attributes) and edges (tail, head, attributes) as Graphviz reads ``source``.

    The legend's nodes are left out: they are not part of the graph drawn.
    """
    done = subprocess.run(["dot", "-Tjson0"], input=source.encode(), capture_output=True, check=True)
    data = json.loads(done.stdout)
    objects = data.get("objects", [])
    nodes = {obj["_gvid"]: obj for obj in objects if "nodes" not in obj and "subgraphs" not in obj}
    edges = [(nodes[e["tail"]]["name"], nodes[e["head"]]["name"], e) for e in data.get("edges", [])]
    drawn = {obj["name"]: obj for obj in nodes.values() if not obj["name"].startswith("legend")}
    return drawn, [edge for edge in edges if edge[0] in drawn]


def _edge_kind(attrs: dict) -> tuple[str, str]:
    return attrs.get("dir", ""), attrs.get("style", "")


def structure(sources: list[str]) -> list[tuple[Counter, Counter]]:
    """Per source: (multiset of node signatures, multiset of edge signatures), names refined away.

    A node starts as (label, fill colour) — Graphviz fills unset ``fillcolor`` lightgrey — and is
    refined by its neighbours' signatures (Weisfeiler-Lehman) over all graphs at once, so equal
    signatures mean the same place in the same shape of graph.
    """
    graphs = [parse(source) for source in sources]
    colour = {(g, name): (n.get("label"), n.get("fillcolor", "lightgrey"))
              for g, (nodes, _) in enumerate(graphs) for name, n in nodes.items()}
    for _ in range(max(len(nodes) for nodes, _ in graphs)):
        around: dict[tuple, list] = {key: [] for key in colour}
        for g, (_, edges) in enumerate(graphs):
            for tail, head, attrs in edges:
                around[(g, tail)].append(("out", _edge_kind(attrs), colour[(g, head)]))
                around[(g, head)].append(("in", _edge_kind(attrs), colour[(g, tail)]))
        signature = {key: (colour[key], tuple(sorted(map(repr, around[key])))) for key in colour}
        ranks = {sig: k for k, sig in enumerate(sorted(set(map(repr, signature.values()))))}
        refined = {key: (colour[key][0], colour[key][1], ranks[repr(signature[key])]) for key in colour}
        if len(set(refined.values())) == len(set(colour.values())):
            break
        colour = refined
    result = []
    for g, (nodes, edges) in enumerate(graphs):
        node_sigs = Counter(colour[(g, name)] for name in nodes)
        edge_sigs = Counter((colour[(g, t)], colour[(g, h)], _edge_kind(a)) for t, h, a in edges)
        result.append((node_sigs, edge_sigs))
    return result


def node_named(nodes: dict[str, dict], label_start: str) -> tuple[str, dict]:
    found = [(name, n) for name, n in nodes.items() if n.get("label", "").startswith(label_start)]
    assert len(found) == 1, f"expected one node labelled {label_start!r}, found {found}"
    return found[0]


def reaches(edges: list[tuple[str, str, dict]], start: str, goal: str) -> bool:
    """Whether edges lead from ``start`` to ``goal`` (edges point from inputs to their users)."""
    out: dict[str, list[str]] = {}
    for tail, head, _ in edges:
        out.setdefault(tail, []).append(head)
    seen, todo = {start}, [start]
    while todo:
        for nxt in out.get(todo.pop(), []):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return goal in seen


def torchviz_dot(*args, **kwargs):
    """``torchviz.make_dot(*args, **kwargs)``; None when torchviz cannot be imported (Python 3.12+: no distutils)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torchviz uses distutils' LooseVersion
        try:
            import torchviz
        except ImportError:
            return None
        return torchviz.make_dot(*args, **kwargs)


class Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 2 + x * 0


def mlp_graph():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    loss = model(torch.randn(3, 4)).pow(2).mean()
    return (loss,), {"params": dict(model.named_parameters())}


def saved_graph():
    x = torch.randn(3, 4)
    w1 = torch.randn(4, 5, requires_grad=True)
    w2 = torch.randn(5, requires_grad=True)
    h = torch.tanh(x @ w1) * w2  # w2: a parameter the multiplication saves (drawn once, as torchviz does)
    out = Double.apply(h).exp().sum()
    return (out,), {"params": {"w1": w1, "w2": w2}, "show_saved": True}


def attrs_graph():
    a = torch.randn(2, 3, requires_grad=True)
    b = torch.cat([a, a.t().reshape(2, 3)], dim=1).sum(dim=1, keepdim=True)
    out = b.transpose(0, 1).softmax(dim=-1).mean()
    return (out,), {"params": {"a": a}, "show_attrs": True, "max_attr_chars": 12}


def multi_output_graph():
    x = torch.randn(2, 3, requires_grad=True)
    h = x.exp()
    loss = (h * h).sum()
    flat = h.view(6)  # a view output: its base h is drawn darkolivegreen3
    return ((loss, flat, x.sin()),), {"params": {"x": x}, "show_saved": True}


# ------------------------------------------------------------------ torchviz parity
@needs_dot
@pytest.mark.parametrize("build", [mlp_graph, saved_graph, attrs_graph, multi_output_graph])
def test_same_nodes_colours_and_edges_as_torchviz(build):
    args, kwargs = build()
    theirs = torchviz_dot(*args, **kwargs)
    if theirs is None:
        pytest.skip("torchviz does not import here")
    theirs = theirs.source
    ours = make_dot(*args, **kwargs).source
    (their_nodes, their_edges), (our_nodes, our_edges) = structure([theirs, ours])
    assert our_nodes == their_nodes
    assert our_edges == their_edges
    assert "cluster_legend" not in ours  # no overlay on a plain graph: nothing to explain


@needs_dot
def test_torchviz_colours_and_node_attributes():
    args, kwargs = saved_graph()
    nodes, _ = parse(make_dot(*args, **kwargs).source)
    fills = Counter(n.get("fillcolor", "lightgrey") for n in nodes.values())
    assert fills["lightblue"] == 2 and fills["darkolivegreen1"] == 1 and fills["orange"] >= 3
    assert node_named(nodes, "w2\n")[1]["fillcolor"] == "lightblue"  # its accumulator is drawn after the mul
    source = make_dot(*args, **kwargs).source
    assert "node [align=left fontname=monospace fontsize=10 height=0.2 ranksep=0.1 shape=box style=filled]" in source


# ------------------------------------------------------------------------ freed graphs
@needs_dot
def test_freed_graph_with_show_saved_draws_saved_slots_as_freed():
    x = torch.randn(3, requires_grad=True)
    w = torch.randn(3, requires_grad=True)
    y = Double.apply((x * w).exp())[torch.tensor([0, 2])].sum()
    y.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        torchviz_dot(y, show_saved=True) or y.grad_fn.next_functions[0][0]._saved_indices  # what torchviz reads
    nodes, edges = parse(make_dot(y, show_saved=True, show_attrs=True).source)
    freed = {n["label"] for n in nodes.values() if n["label"].endswith("freed") and n.get("fillcolor") != "gray95"}
    # exp's result, mul's two, Double's ctx.saved_tensors, the index's list of index tensors
    assert freed == {"result\n freed", "self\n freed", "other\n freed", "freed", "indices\n freed"}
    exp_name, exp_node = node_named(nodes, "ExpBackward0")
    assert "[freed]" in exp_node["label"] and "dashed" in exp_node["style"]
    assert any(t == exp_name and nodes[h]["label"] == "result\n freed" for t, h, _ in edges)


# ------------------------------------------------------------------------ large graphs
def chain(steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.randn(4, 4, requires_grad=True)
    h = torch.randn(1, 4)
    for _ in range(steps):
        h = torch.tanh(h @ w)
    return h, w


@pytest.fixture
def low_recursion_limit() -> Iterator[None]:
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(250)  # torchviz recurses once per node: it fails far below 10,000
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


@needs_dot
def test_10k_node_chain_no_recursion_and_summarised_with_path_to_root(low_recursion_limit):
    h, w = chain(5000)  # 10,000 backward nodes and w's accumulator
    dot = make_dot(h, params={"w": w}, show_saved=True, max_nodes=2000)
    labels = [line for line in dot.body if "label=" in line]
    assert len(labels) < 200
    sys.setrecursionlimit(1000)  # dot's JSON layout below is not ours to limit
    nodes, edges = parse(dot.source)
    collapsed = [n["label"] for n in nodes.values() if n["label"].startswith("…")]
    assert len(collapsed) == 1
    match = re.fullmatch(r"… ([\d,]+) nodes \((\w+) ×([\d,]+), (\w+) ×([\d,]+)\) …", collapsed[0])
    assert match, collapsed[0]
    assert {match[2], match[4]} == {"TanhBackward0", "MmBackward0"}
    drawn = sum(1 for n in nodes.values() if n["label"].startswith(("TanhBackward0", "MmBackward0")))
    assert int(match[1].replace(",", "")) + drawn == 10_000
    output = node_named(nodes, "\n (1, 4)")[0]
    root = next(tail for tail, head, _ in edges if head == output)
    assert nodes[root]["label"] == "TanhBackward0"
    assert reaches(edges, node_named(nodes, "… ")[0], root)  # the collapsed chain still leads to the root


def test_10k_node_chain_drawn_whole_without_recursion(low_recursion_limit):
    h, w = chain(5000)
    with pytest.raises(RecursionError):  # the limit is low enough to stop a recursive walk
        torchviz_dot(h) or _recursive_depth(h.grad_fn)
    dot = make_dot(h, params={"w": w}, max_nodes=1_000_000)
    assert sum(1 for line in dot.body if "[label=" in line) == 10_000 + 3  # nodes, accumulator, w, output


def _recursive_depth(node) -> int:
    return 1 + max((_recursive_depth(child) for child, _ in node.next_functions if child is not None), default=0)


# --------------------------------------------------------------------------- overlay
def carried_state_session(steps_in_second: int = 1):
    """The RNN bug under a real session: step 1 keeps using step 0's hidden state, whose graph step 0's
    backward freed, so step 1's backward raises."""
    w = torch.randn(4, 4, requires_grad=True)
    with graphwatch.watch(summary=False) as gw:
        with gw.step():
            carried_line = sys._getframe().f_lineno + 1
            h = torch.tanh(torch.randn(1, 4) @ w)
            h.sum().backward()
        with gw.step():
            h2 = h
            for _ in range(steps_in_second):
                h2 = torch.tanh(h2 @ w)
            loss = h2.sum()
            with pytest.raises(RuntimeError, match="backward through the graph a second time"):
                loss.backward()
    return gw, w, h, loss, carried_line


@needs_dot
def test_overlay_marks_carried_edge_earlier_and_freed_nodes():
    gw, w, h, loss, carried_line = carried_state_session()
    carried = node_record(h.grad_fn)
    assert (carried.step, carried.freed_by) == (0, 0)
    where = gw.trace.where(carried.site)
    assert where.endswith(f"test_dot.py:{carried_line}")
    nodes, edges = parse(make_dot(loss, params={"w": w}, show_saved=True, trace=gw.trace).source)
    tanh0, tanh0_node = node_named(nodes, "TanhBackward0\nfreed by backward #0")
    assert tanh0_node["label"] == "TanhBackward0\nfreed by backward #0\nstep 0"
    assert (tanh0_node["color"], tanh0_node["penwidth"]) == ("red", "2")
    assert tanh0_node["style"] == "filled,dashed" and tanh0_node["fillcolor"] == "gray95"
    red = [(tail, head, attrs) for tail, head, attrs in edges if attrs.get("color") == "red"]
    assert len(red) == 1
    tail, head, attrs = red[0]
    assert tail == tanh0 and nodes[head]["label"] == "MmBackward0\nfreed by backward #1"  # step 1's use of h
    assert (attrs["style"], attrs["label"]) == ("bold", where)
    step1 = [n for n in nodes.values() if n["label"].endswith("freed by backward #1") or n["label"] == "SumBackward0"]
    assert len(step1) == 3 and not any("color" in n for n in step1)  # this step's nodes: not outlined
    assert "cluster_legend" in make_dot(loss, trace=gw.trace).source


@needs_dot
def test_overlay_saved_labels_show_bytes_and_retained_mark():
    x = torch.randn(2, 3, requires_grad=True)
    with graphwatch.watch(summary=False) as gw:
        y = (x.exp() * x).sum()
        y.backward(retain_graph=True)
    retained = {node_record(y.grad_fn.next_functions[0][0]).id}  # the multiplication
    nodes, _ = parse(make_dot(y, params={"x": x}, show_saved=True, trace=gw.trace, retained=retained).source)
    mul = node_named(nodes, "MulBackward0")[1]
    assert mul["label"] == "MulBackward0\nretained graph" and mul["peripheries"] == "2"
    assert sorted(r.nbytes for r in gw.trace.saved.values()) == [0, 24, 24]  # mul's self: exp's result's storage
    saved = sorted(n["label"] for n in nodes.values() if n.get("fillcolor") == "orange")
    assert saved == ["other\n (2, 3)\n 24 B", "result\n (2, 3)\n 24 B", "self\n (2, 3)\n shared storage"]


@needs_dot
def test_session_snapshots_show_the_crossing_and_render_to_svg():
    gw, _, h, _, carried_line = carried_state_session()
    snapshots = {s.reason: s for s in gw.trace.snapshots}
    crossing = snapshots["graph crosses steps"]  # taken before step 1's backward ran
    nodes, edges = parse(crossing.dot)
    red = [attrs for _, _, attrs in edges if attrs.get("color") == "red"]
    assert [attrs["label"] for attrs in red] == [gw.trace.where(node_record(h.grad_fn).site)]
    assert red[0]["label"].endswith(f"test_dot.py:{carried_line}")
    assert any(n["label"] == "result\n (1, 4)\n 16 B" for n in nodes.values())  # step 1's live saved tensor
    assert not any(n.get("fillcolor") == "darkolivegreen1" for n in nodes.values())  # no output tensor drawn
    assert render_svg(snapshots["backward through a freed graph"].dot).startswith("<svg")


@needs_dot
def test_summary_keeps_the_deep_crossing_edge_and_its_path_to_the_root(low_recursion_limit):
    gw, _w, h, loss, _ = carried_state_session(steps_in_second=3000)  # 6,001 step-1 nodes above the crossing
    dot = snapshot_dot([loss.grad_fn], gw.trace, step=1, max_nodes=500)
    sys.setrecursionlimit(1000)  # for dot's JSON below
    nodes, edges = parse(dot)
    assert len(nodes) < 150
    red = [(tail, head, attrs) for tail, head, attrs in edges if attrs.get("color") == "red"]
    assert len(red) == 1
    tail, head, attrs = red[0]
    assert nodes[tail]["label"] == "TanhBackward0\nfreed by backward #0\nstep 0"
    assert nodes[head]["label"] == "MmBackward0\nfreed by backward #1"
    assert attrs["label"] == gw.trace.where(node_record(h.grad_fn).site)
    collapsed = [n["label"] for n in nodes.values() if n["label"].startswith("… ")]
    assert len(collapsed) == 1 and "TanhBackward0 ×" in collapsed[0] and "MmBackward0 ×" in collapsed[0]
    root = node_named(nodes, "SumBackward0")[0]
    assert reaches(edges, tail, root)  # the crossing still leads to the root, through the collapsed chain


def test_values_packed_by_user_hooks_are_drawn_without_crashing():
    x = torch.randn(5, requires_grad=True)
    with graphwatch.watch(summary=False) as gw:
        with torch.autograd.graph.save_on_cpu():  # its pack hook returns (device, cpu tensor)
            y = x.sin().exp()
        z = checkpoint(lambda t: t.cos().exp(), x, use_reentrant=False).sum()  # returns opaque holders
        drawn_y = make_dot(y, show_saved=True, trace=gw.trace).source
        drawn_z = make_dot(z, show_saved=True, show_attrs=True, trace=gw.trace).source
        (y.sum() + z).backward()  # takes the session's step-0 snapshot of both graphs
    assert 'label="result\n (5)\n 20 B"' in drawn_y
    assert 'label="result\n (packed by saved-tensor hooks)"' in drawn_z
    assert "result: [saved tensor]" in drawn_z
    assert "(packed by saved-tensor hooks)" in gw.trace.snapshots[0].dot


def test_legend_only_with_overlay_or_when_asked():
    y = torch.ones(2, requires_grad=True).exp().sum()
    assert "cluster_legend" not in make_dot(y).source
    assert "cluster_legend" in make_dot(y, legend=True).source
    assert "cluster_legend" in make_dot(y, current_step=0).source


# ---------------------------------------------------------------------------- golden
def small_graph() -> tuple[torch.Tensor, dict]:
    x = torch.ones(2, 3, requires_grad=True)
    b = torch.zeros(3, requires_grad=True)
    y = (torch.tanh(x * 2 + b) * x).sum(dim=1).mean()
    return y, {"x": x, "b": b}


@pytest.mark.parametrize("name, kwargs, free", [
    ("small.dot", {}, False),
    ("small_saved_attrs.dot", {"show_saved": True, "show_attrs": True}, False),
    ("small_freed.dot", {"show_saved": True}, True),
])
def test_golden_dot_source(name, kwargs, free):
    y, params = small_graph()
    if free:
        y.backward()
    source = make_dot(y, params=params, **kwargs).source
    path = GOLDEN / name
    if UPDATE_GOLDEN:
        path.write_text(source)
    assert source == path.read_text(), f"{name} changed; GRAPHWATCH_UPDATE_GOLDEN=1 rewrites it"


def test_same_graph_gives_same_source():
    first, second = small_graph(), small_graph()
    assert make_dot(first[0], params=first[1]).source == make_dot(second[0], params=second[1]).source


# ------------------------------------------------------------------------------- svg
@needs_dot
def test_render_svg_returns_inline_svg():
    y, params = small_graph()
    svg = render_svg(make_dot(y, params=params, legend=True).source)
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    assert "<?xml" not in svg and "<!DOCTYPE" not in svg
    assert "AccumulateGrad" in svg and "graphwatch legend" in svg


def test_render_svg_without_dot_returns_none(monkeypatch):
    monkeypatch.setattr(svg_module.shutil, "which", lambda name: None)
    assert not dot_available()
    assert render_svg("digraph { a -> b }") is None
    assert "apt-get install graphviz" in DOT_MISSING_NOTICE


@needs_dot
def test_render_svg_bad_source_raises_dot_error():
    with pytest.raises(DotError, match="could not render the graph"):
        render_svg("digraph { a -> }")


def test_docstring_examples_run():
    for module in (dot_module, svg_module):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__


def test_make_dot_rejects_non_tensors():
    with pytest.raises(TypeError, match="make_dot draws tensors, got int"):
        make_dot(3)


def test_a_backward_twice_inside_one_step_is_not_captioned_as_crossing_steps():
    x = torch.ones(3, requires_grad=True)
    with pytest.raises(graphwatch.BackwardTwiceError), graphwatch.watch(summary=False) as gw:
        y = (x.exp() * 2).sum()
        y.backward()
        y.backward()
    assert [s.reason for s in gw.trace.snapshots] == ["first backward", "backward through a freed graph"]
    assert {s.step for s in gw.trace.snapshots} == {0}


def test_session_snapshots_name_parameters_as_the_users_frames_hold_their_modules():
    cell, head = torch.nn.RNNCell(3, 4), torch.nn.Linear(4, 1)
    with graphwatch.watch(summary=False) as gw:
        h = torch.zeros(1, 4)
        h = cell(torch.randn(1, 3), h)
        head(h).sum().backward()
    dot = gw.trace.snapshots[0].dot
    for name in ("cell.weight_ih", "cell.weight_hh", "cell.bias_ih", "head.weight", "head.bias"):
        assert name in dot, name
    assert "(4, 3)" in dot  # the shape stays under the name


@pytest.mark.skipif(not dot_available(), reason="Graphviz's dot is not installed")
def test_a_reports_graphs_are_laid_out_by_one_dot_process_and_a_rejected_one_costs_only_its_own(tmp_path, monkeypatch):
    """Starting ``dot`` costs more than laying out a small graph: :func:`render_svgs` gives one process every graph,
    each drawn as :func:`render_svg` draws it alone; a graph ``dot`` rejects gets its error and the others their
    pictures (each laid out alone then)."""
    y = (torch.ones(2, requires_grad=True) * 2).exp().sum()
    sources = [make_dot(y, params={}).source, "digraph { a -> b }", "digraph { c }"]
    alone = [render_svg(source) for source in sources]
    path, laid_out = dot_that_keeps_its_input(tmp_path)
    monkeypatch.setenv("PATH", path)
    assert render_svgs(sources) == alone
    assert [len(graphs) for graphs in laid_out().values()] == [3]  # one process, one call, three graphs
    mixed = render_svgs([sources[0], "digraph { a -> }", sources[2]])
    assert mixed is not None and isinstance(mixed[1], DotError) and [mixed[0], mixed[2]] == [alone[0], alone[2]]
