"""The focused picture a report shows for each snapshot: what shows the problem, in about 30 boxes.

Real training loops under graphwatch, their snapshots parsed as Graphviz reads them (``dot -Tjson0``).
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import torch

import graphwatch
from graphwatch.rendering.focus import FOCUS_BOXES
from graphwatch.rendering.svg import dot_available

pytestmark = pytest.mark.skipif(not dot_available(), reason="Graphviz `dot` is not installed")
ABOUT = FOCUS_BOXES + 5  # "about 30": a fold or two over the budget


def parse(source: str) -> tuple[dict[str, dict], list[tuple[str, str, dict]]]:
    """Nodes (name -> attributes) and edges (tail name, head name, attributes) as Graphviz reads ``source``."""
    done = subprocess.run(["dot", "-Tjson0"], input=source.encode(), capture_output=True, check=True)
    data = json.loads(done.stdout)
    objects = [obj for obj in data.get("objects", []) if "nodes" not in obj and "subgraphs" not in obj]
    names = {obj["_gvid"]: obj["name"] for obj in objects}
    edges = [(names[e["tail"]], names[e["head"]], e) for e in data.get("edges", [])]
    return {obj["name"]: obj for obj in objects if not obj["name"].startswith("legend")}, edges


def labels(nodes: dict[str, dict]) -> list[str]:
    return [node["label"] for node in nodes.values()]


def reaches(edges: list[tuple[str, str, dict]], start: str, goal: str) -> bool:
    """Whether ``goal`` is reached from ``start`` along the drawn edges (inputs point to their users)."""
    seen, todo = {start}, [start]
    while todo:
        node = todo.pop()
        for tail, head, _ in edges:
            if tail == node and head not in seen:
                seen.add(head)
                todo.append(head)
    return goal in seen


def named(nodes: dict[str, dict], pattern: str) -> list[str]:
    return [name for name, node in nodes.items() if re.search(pattern, node["label"])]


# ----------------------------------------------------------------------------- loops
@pytest.fixture(scope="module")
def rnn_carried() -> graphwatch.Trace:
    """An RNN unrolled 20 times a step whose state is never detached, backwarded with retain_graph=True."""
    torch.manual_seed(0)
    cell, head = torch.nn.RNNCell(8, 16), torch.nn.Linear(16, 1)
    with graphwatch.watch(summary=False) as gw:
        h = torch.zeros(4, 16)
        for _ in range(3):
            for _ in range(20):
                h = cell(torch.randn(4, 8), h)  # carried
            head(h).pow(2).mean().backward(retain_graph=True)
    return gw.trace


def gan_freed_generator() -> graphwatch.Trace:
    """The discriminator's backward frees the generator's graph; the generator's backward then meets it."""
    torch.manual_seed(0)
    G = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    D = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.LeakyReLU(0.2), torch.nn.Linear(16, 1))
    opt_g, opt_d = torch.optim.SGD(G.parameters(), lr=0.01), torch.optim.SGD(D.parameters(), lr=0.01)
    bce = torch.nn.BCEWithLogitsLoss()
    with pytest.raises(graphwatch.BackwardTwiceError), graphwatch.watch(summary=False) as gw:
        fake = G(torch.randn(8, 4))
        opt_d.zero_grad()
        bce(D(fake), torch.zeros(8, 1)).backward()  # should have been D(fake.detach())
        opt_d.step()
        opt_g.zero_grad()
        bce(D(fake), torch.ones(8, 1)).backward()
    return gw.trace


def validation_kept() -> graphwatch.Trace:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x_val, y_val = torch.randn(128, 16), torch.randn(128, 1)
    history = []
    with graphwatch.watch(summary=False) as gw:
        for _ in range(6):
            loss = torch.nn.functional.mse_loss(model(torch.randn(32, 16)), torch.randn(32, 1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            history.append(torch.nn.functional.mse_loss(model(x_val), y_val))  # no torch.no_grad()
    return gw.trace


def snapshot(trace: graphwatch.Trace, reason: str) -> graphwatch.model.Snapshot:
    return next(s for s in trace.snapshots if s.reason.startswith(reason))


# ----------------------------------------------------------------------------- tests
def test_a_crossing_is_shown_with_its_whole_way_to_the_root_in_about_30_boxes(rnn_carried: graphwatch.Trace) -> None:
    crossing = snapshot(rnn_carried, "graph crosses steps")
    whole, _ = parse(crossing.dot)
    nodes, edges = parse(crossing.focus or "")
    assert len(nodes) <= ABOUT < len(whole)
    red = [(tail, head) for tail, head, attrs in edges if attrs.get("color") == "red"]
    assert red, "the carried edge is in the focused picture"
    (root,) = named(nodes, r"^MeanBackward0")
    assert all(reaches(edges, tail, root) for tail, _ in red)  # the way from the crossing to the root
    assert all("\nstep 0" in nodes[tail]["label"] for tail, _ in red)  # from the earlier step


def test_what_is_left_out_is_folded_into_counts_by_step(rnn_carried: graphwatch.Trace) -> None:
    nodes, _ = parse(snapshot(rnn_carried, "graph crosses steps").focus or "")
    folds = [label for label in labels(nodes) if label.startswith("+")]
    assert folds and all(re.match(r"\+[\d,]+ (nodes? of step \d+|parameters?)", label) for label in folds), folds
    assert any(re.match(r"\+[\d,]+ nodes of step 1\n[\d.]+ \w*B saved", label) for label in folds), folds
    for node in nodes.values():  # what each fold holds is its hover title: op by op
        if node["label"].startswith("+") and "nodes" in node["label"]:
            assert re.match(r"\+[\d,]+ nodes of step \d: (\w+Backward0 ×\d+(, )?)+$", node["tooltip"]), node["tooltip"]


def test_parameters_feeding_the_focus_are_named_boxes(rnn_carried: graphwatch.Trace) -> None:
    nodes, edges = parse(snapshot(rnn_carried, "graph crosses steps").focus or "")
    params = {node["label"].split("\n")[0] for node in nodes.values() if node.get("fillcolor") == "lightblue"}
    assert {"cell.weight_hh", "head.weight"} <= params
    assert not named(nodes, r"^AccumulateGrad")  # a parameter is one box: its name, not its accumulator
    (weight,) = named(nodes, r"^head\.weight\n")
    assert any(tail == weight and nodes[head]["label"].startswith("AddmmBackward0") for tail, head, _ in edges)


def test_earlier_step_nodes_are_outlined_red_but_filled_grey(rnn_carried: graphwatch.Trace) -> None:
    nodes, _ = parse(snapshot(rnn_carried, "graph crosses steps").focus or "")
    earlier = [node for node in nodes.values() if node.get("color") == "red"]
    assert earlier and all(node.get("fillcolor") in ("lightgrey", "gray95") for node in earlier)


def test_a_failing_backward_is_shown_up_to_the_stale_node_it_met() -> None:
    """A GAN whose discriminator backward freed the generator's graph: the picture reaches the generator's
    node freed by backward #0, through the nodes the failing backward #1 already ran (and freed)."""
    trace = gan_freed_generator()
    failed = snapshot(trace, "backward through a freed graph")
    nodes, edges = parse(failed.focus or "")
    assert len(nodes) <= ABOUT
    stale = named(nodes, r"^AddmmBackward0\nfreed by backward #0")
    (root,) = named(nodes, r"^BinaryCrossEntropyWithLogitsBackward0")
    assert stale and all(reaches(edges, node, root) for node in stale)
    params = {node["label"].split("\n")[0] for node in nodes.values() if node.get("fillcolor") == "lightblue"}
    assert {"G.2.weight", "D.0.weight"} <= params


def test_a_kept_list_is_drawn_as_its_holder_over_its_first_graphs_with_their_bytes_and_counts_the_rest() -> None:
    trace = validation_kept()
    kept = snapshot(trace, "kept alive by `history`")
    assert "0 autograd nodes" not in kept.reason
    nodes, edges = parse(kept.focus or "")
    assert len(nodes) <= ABOUT
    (holder,) = named(nodes, r"^history\n\(list\)$")
    items = named(nodes, r"^history\[\d+\]\n")
    assert len(items) >= 3 and all((item, holder) in {(t, h) for t, h, _ in edges} for item in items)
    last = max(items, key=lambda item: int(re.findall(r"\[(\d+)\]", nodes[item]["label"])[0]))
    assert nodes[last]["label"].endswith("this step's graph: not counted")  # the step it is the end of
    for item in set(items) - {last}:
        assert re.search(r"keeps step \d+: \d+ nodes, [\d.]+ KiB saved$", nodes[item]["label"]), nodes[item]["label"]
    steps = {int(m[1]) for label in labels(nodes) if (m := re.search(r"\nstep (\d+)", label))}
    assert len(steps) >= 2  # the graphs of the first steps it keeps, each drawn; the others counted:
    (more,) = named(nodes, r"^\+3 more graphs of steps 3, 4, 5,\neach like the ones drawn$")
    assert (holder, more) in {(t, h) for t, h, _ in edges}  # (below the holder: its arrow drawn backwards)


def test_a_small_graph_is_drawn_whole() -> None:
    x = torch.ones(3, requires_grad=True)
    with graphwatch.watch(summary=False) as gw:
        (x.exp() * 2).sum().backward()
    first = gw.trace.snapshots[0]
    whole, _ = parse(first.dot)
    focused, _ = parse(first.focus or "")
    assert sorted(labels(focused)) == sorted(labels(whole))


class Trainer:
    """A training loop that keeps its model on ``self``: no frame holds the module by a name of its own."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def fit(self) -> graphwatch.Trace:
        with graphwatch.watch(summary=False) as gw:
            for _ in range(3):
                self.opt.zero_grad()
                self.model(torch.randn(2, 4)).pow(2).mean().backward()
                self.opt.step()
        return gw.trace


def test_parameters_of_a_model_kept_on_self_are_named_from_it() -> None:
    first = Trainer().fit().snapshots[0]
    for source in (first.dot, first.focus or ""):
        nodes, _ = parse(source)
        params = sorted(node["label"].split("\n")[0] for node in nodes.values() if node.get("fillcolor") == "lightblue")
        assert params == ["self.model.0.bias", "self.model.0.weight", "self.model.2.bias", "self.model.2.weight"]


def test_a_leaf_tensor_that_requires_grad_is_named_by_its_variable() -> None:
    weights = torch.ones(3, requires_grad=True)
    with graphwatch.watch(summary=False) as gw:
        (weights.exp() * 2).sum().backward()
    nodes, _ = parse(gw.trace.snapshots[0].dot)
    assert [node["label"] for node in nodes.values() if node.get("fillcolor") == "lightblue"] == ["weights\n (3)"]


def test_a_bug_inside_one_step_is_not_captioned_as_crossing_steps() -> None:
    """A backward that meets a graph its own step freed (a GAN's generator graph, a loss backwarded twice)
    is drawn as what it is, not as a graph that crosses steps."""
    x = torch.ones(3, requires_grad=True)
    with pytest.raises(graphwatch.BackwardTwiceError), graphwatch.watch(summary=False) as gw:
        y = (x.exp() * 2).sum()
        y.backward()
        y.backward()
    for trace in (gw.trace, gan_freed_generator()):
        reasons = [s.reason for s in trace.snapshots]
        assert "backward through a freed graph" in reasons and "graph crosses steps" not in reasons, reasons
