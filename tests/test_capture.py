"""What graphwatch records is exact.

Every expected number here is derived from the graph the test builds (counted
by hand or by walking the real ``grad_fn`` graph), never read back from
graphwatch itself.  Lines are found through ``# <mark: ...>`` comments, so
moving code around keeps the tests right.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import graphwatch

pytestmark = pytest.mark.usefixtures("no_session_left")

THIS_FILE = os.path.abspath(__file__)
_SOURCE = Path(THIS_FILE).read_text().splitlines()


def _line(mark: str) -> int:
    """Number of the (only) line ending with ``# <mark: {mark}>``."""
    hits = [i for i, text in enumerate(_SOURCE, 1) if text.rstrip().endswith(f"# <mark: {mark}>")]
    assert len(hits) == 1, (mark, hits)
    return hits[0]


def _graph(root) -> list[tuple[str, int]]:
    """(name, sequence number) of every non-leaf node reachable from ``root``: our own walk."""
    seen: dict[tuple[str, int], None] = {}
    stack = [root]
    while stack:
        node = stack.pop()
        if node is None or node.name() == "torch::autograd::AccumulateGrad":
            continue
        key = (node.name(), node._sequence_nr())
        if key in seen:
            continue
        seen[key] = None
        stack.extend(child for child, _ in node.next_functions)
    return list(seen)


def _site(gw, site_id):
    site = gw.trace.site(site_id)
    assert site is not None
    return site


def _at(gw, site_id) -> tuple[str, int]:
    site = _site(gw, site_id)
    return os.path.abspath(site.file), site.line


def _watch(**options):
    return graphwatch.watch(summary=False, **options)


# ------------------------------------------------------------ backwards
def test_nodes_reached_counts_every_non_leaf_node_once():
    x = torch.randn(5, requires_grad=True)
    with _watch() as gw:
        a = x.exp()
        b = a.sin() + a.cos()  # a diamond: ExpBackward0 is reached twice, counted once
        loss = b.sum()
        expected = _graph(loss.grad_fn)
        loss.backward(retain_graph=True)
        loss.backward()
    assert len(expected) == 5  # Sum, Add, Sin, Cos, Exp
    assert [bw.nodes_reached for bw in gw.trace.backwards] == [5, 5]
    assert [bw.earlier_nodes_reached for bw in gw.trace.backwards] == [0, 0]


def test_node_records_are_named_by_node_name():
    w = torch.randn(3, 4, requires_grad=True)
    with _watch() as gw:
        out = F.softmax(torch.randn(2, 3) @ w, dim=1)
        loss = F.mse_loss(out.tanh(), torch.zeros(2, 4))
        expected = sorted(name for name, _ in _graph(loss.grad_fn))
        loss.backward()
    assert sorted(n.op for n in gw.trace.nodes.values()) == expected
    assert {"MmBackward0", "SoftmaxBackward0", "TanhBackward0", "MseLossBackward0"} <= set(expected)


def test_node_records_carry_the_nodes_sequence_numbers():
    x = torch.randn(4, requires_grad=True)
    with _watch() as gw:
        loss = (x.exp() * x.sin()).sum()
        expected = sorted(_graph(loss.grad_fn), key=lambda k: k[1])
        loss.backward()
    assert sorted(((n.op, n.seq) for n in gw.trace.nodes.values()), key=lambda k: k[1]) == expected


def test_backward_records_api_retain_create_site_and_step():
    x = torch.randn(4, requires_grad=True)
    with _watch() as gw:
        with gw.step():
            loss = x.exp().sum()
            loss.backward(retain_graph=True)  # <mark: bw retain>
            (g,) = torch.autograd.grad(loss, x, create_graph=True)  # <mark: bw grad create>
            torch.autograd.backward([g.pow(2).sum()])  # <mark: bw autograd.backward>
        with gw.step():
            torch.autograd.grad(x.sin().sum(), [x])  # <mark: bw grad plain>
    rows = [(b.api, b.retain_graph, b.create_graph, b.step, _at(gw, b.site)) for b in gw.trace.backwards]
    assert rows == [
        ("backward", True, False, 0, (THIS_FILE, _line("bw retain"))),
        ("grad", True, True, 0, (THIS_FILE, _line("bw grad create"))),  # create_graph implies retain_graph
        ("backward", False, False, 0, (THIS_FILE, _line("bw autograd.backward"))),
        ("grad", False, False, 1, (THIS_FILE, _line("bw grad plain"))),
    ]
    assert [s.backwards for s in gw.trace.steps] == [[0, 1, 2], [3]]
    assert all(b.error is None and b.seconds > 0 for b in gw.trace.backwards)


def test_backward_through_earlier_steps_counts_their_nodes():
    """A hidden state carried without detach: step k's backward reaches 3 nodes of each earlier step."""
    w = torch.randn(3, 3, requires_grad=True)
    with _watch() as gw:
        h = torch.zeros(3)
        for _ in range(4):
            with gw.step():
                h = torch.tanh(w @ h + 1)  # MvBackward0, AddBackward0, TanhBackward0 per step
                h.sum().backward(retain_graph=True)  # SumBackward0, the root, is new each step
    assert [b.nodes_reached for b in gw.trace.backwards] == [4, 7, 10, 13]
    assert [b.earlier_nodes_reached for b in gw.trace.backwards] == [0, 3, 6, 9]
    assert [b.earlier_steps for b in gw.trace.backwards] == [[], [0], [0, 1], [0, 1, 2]]


# ---------------------------------------------------------- saved tensors
def test_saved_tensor_kinds_bytes_shapes_and_links():
    w = torch.randn(3, 4, requires_grad=True)  # a leaf that requires grad: "parameter"
    inp = torch.randn(3, 4)  # a leaf that does not: "input"
    with _watch() as gw:
        a = w.sin()  # <mark: saves parameter>
        b = a * inp  # <mark: saves input>
        c = b.tanh()  # <mark: saves activation>
        c.sum().backward()
    rows = sorted((_at(gw, s.site)[1], s.kind, s.nbytes, s.shape, s.dtype, s.device, s.unpacked) for s in gw.trace.saved.values())
    assert rows == [
        (_line("saves parameter"), "parameter", 48, (3, 4), "float32", "cpu", 1),
        (_line("saves input"), "input", 48, (3, 4), "float32", "cpu", 1),  # a is not saved: inp needs no grad
        (_line("saves activation"), "activation", 48, (3, 4), "float32", "cpu", 1),  # tanh saves its output
    ]
    ops = {s.kind: gw.trace.nodes[s.node].op for s in gw.trace.saved.values()}
    assert ops == {"parameter": "SinBackward0", "input": "MulBackward0", "activation": "TanhBackward0"}
    for s in gw.trace.saved.values():
        assert s.id in gw.trace.nodes[s.node].saved
    step = gw.trace.steps[0]
    assert (step.saved_packed, step.saved_bytes_packed) == (3, 144)


def test_saved_bytes_are_counted_once_per_storage():
    w = torch.randn(4, 3, requires_grad=True)  # 48 bytes
    with _watch() as gw:
        y = w * w  # <mark: same tensor twice>
        z = y.exp()  # <mark: exp output>
        q = z * z  # <mark: exp output twice more>
        q.sum().backward()
    by_line = {}
    for s in sorted(gw.trace.saved.values(), key=lambda s: s.id):
        by_line.setdefault(_at(gw, s.site)[1], []).append(s.nbytes)
    assert by_line == {
        _line("same tensor twice"): [48, 0],
        _line("exp output"): [48],
        _line("exp output twice more"): [0, 0],  # z's storage is already counted by exp
    }
    step = gw.trace.steps[0]
    assert (step.saved_packed, step.saved_bytes_packed) == (5, 96)
    assert gw.trace.backwards[0].bytes_freed == 96
    assert gw.trace.backwards[0].saved_freed == 5


def test_saved_views_of_one_storage_count_the_storage_once():
    w = torch.randn(8, requires_grad=True)  # one 32-byte storage
    with _watch() as gw:
        v = w[:4].sin() + w[4:].cos()  # two views of w's storage are saved
        v.sum().backward()
    assert sorted(s.nbytes for s in gw.trace.saved.values()) == [0, 32]
    assert gw.trace.steps[0].saved_bytes_packed == 32


def test_freed_by_names_the_backward_and_collected_graphs_have_freed_step_only():
    x = torch.randn(5, requires_grad=True)
    with _watch(level="precise") as gw:  # records for every saved tensor and node (the default builds them on suspicion)
        with gw.step():
            a = x.exp()  # <mark: freed by backward>
            a.sum().backward()
        with gw.step():
            b = x.sin()  # <mark: collected>
            del b  # the graph dies without any backward
        with gw.step():
            c = x.tanh()  # <mark: freed by second backward>
            loss = c.sum()
            loss.backward(retain_graph=True)
            loss.backward()
    saved = {_at(gw, s.site)[1]: s for s in gw.trace.saved.values()}
    first, collected, retained = saved[_line("freed by backward")], saved[_line("collected")], saved[_line("freed by second backward")]
    assert (first.freed_by, first.freed_step, first.alive) == (0, 0, False)
    assert (collected.freed_by, collected.freed_step, collected.alive) == (None, 1, False)
    assert (retained.freed_by, retained.freed_step, retained.unpacked) == (2, 2, 2)
    assert [(b.saved_freed, b.bytes_freed) for b in gw.trace.backwards] == [(1, 20), (0, 0), (1, 20)]
    nodes = {n.op: n for n in gw.trace.nodes.values()}
    assert nodes["ExpBackward0"].freed_by == 0
    assert nodes["TanhBackward0"].freed_by == 2
    assert "SinBackward0" not in nodes  # no backward (no walk) ever reached it


def test_saved_tensors_still_alive_at_a_step_end_are_counted_live():
    w = torch.randn(4, 4, requires_grad=True)  # 64 bytes
    with _watch() as gw:
        with gw.step():
            y = w.sin()  # saves w: 64 leaf bytes
            z = (y * 2).exp()  # saves z: 64 activation bytes
        with gw.step():
            z.sum().backward()
    first, second = gw.trace.steps
    assert (first.live_leaf_bytes, first.live_activation_bytes, first.saved_alive_by_step) == (64, 64, {0: 64})
    assert first.live_saved_bytes == 128
    assert (second.live_leaf_bytes, second.live_activation_bytes, second.saved_alive_by_step) == (0, 0, {})
    assert first.rss_bytes > 0 and second.rss_bytes > 0
    assert first.cuda_allocated is None  # no CUDA tensors


def test_save_on_cpu_inside_the_session_is_reported_untracked():
    x = torch.randn(5, requires_grad=True)
    with _watch() as gw:
        with torch.autograd.graph.save_on_cpu():
            y = x.sin().exp()  # two saved tensors, packed by save_on_cpu's hooks, not ours
        y.sum().backward()
    assert gw.trace.saved == {}
    assert gw.trace.untracked_saved == 2


def test_save_on_cpu_around_the_session_is_tracked():
    x = torch.randn(5, requires_grad=True)
    with torch.autograd.graph.save_on_cpu():
        with _watch() as gw:
            y = x.sin().exp()
            y.sum().backward()
    assert sorted(s.kind for s in gw.trace.saved.values()) == ["activation", "parameter"]
    assert gw.trace.untracked_saved == 0
    assert all(s.freed_by == 0 and s.unpacked == 1 for s in gw.trace.saved.values())


def test_graph_dropped_after_the_session_leaves_the_trace_unchanged():
    x = torch.ones(3, requires_grad=True)
    with _watch() as gw:
        y = x.exp()
        loss = y.sum()
        loss.backward(retain_graph=True)  # the graph is still alive when the session ends
    at_exit = graphwatch.model.trace_to_dict(gw.trace)
    assert [s.alive for s in gw.trace.saved.values()] == [True]
    del y, loss  # frees the saved tensor and the nodes, after the session
    assert graphwatch.model.trace_to_dict(gw.trace) == at_exit


# ------------------------------------------------------------ call sites
def _helper_exp(t):
    return t.exp()  # <mark: helper exp>


def test_call_site_is_the_users_line_with_its_caller():
    x = torch.randn(3, requires_grad=True)
    with _watch() as gw:
        y = _helper_exp(x)  # <mark: calls helper>
        z = y.sin()  # <mark: sin>
        z.sum().backward()
    nodes = {n.op: n for n in gw.trace.nodes.values()}
    exp_site = _site(gw, nodes["ExpBackward0"].site)
    assert (os.path.abspath(exp_site.file), exp_site.line, exp_site.function) == (THIS_FILE, _line("helper exp"), "_helper_exp")
    assert exp_site.source == "return t.exp()  # <mark: helper exp>"
    caller = _site(gw, exp_site.caller)
    assert (os.path.abspath(caller.file), caller.line, caller.function) == (
        THIS_FILE,
        _line("calls helper"),
        "test_call_site_is_the_users_line_with_its_caller",
    )
    sin_site = _site(gw, nodes["SinBackward0"].site)
    assert (os.path.abspath(sin_site.file), sin_site.line, sin_site.function) == (
        THIS_FILE,
        _line("sin"),
        "test_call_site_is_the_users_line_with_its_caller",
    )
    assert not nodes["ExpBackward0"].site_inferred and not nodes["SinBackward0"].site_inferred
    for s in gw.trace.saved.values():  # a saved tensor has the line of the node that saved it
        assert s.site == gw.trace.nodes[s.node].site


def test_module_calls_are_tagged_with_the_users_line_not_torchs():
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))
    with _watch() as gw:
        out = model(torch.randn(3, 4))  # <mark: model call>
        loss = F.cross_entropy(out, torch.tensor([0, 1, 1]))  # <mark: loss>
        loss.backward()
    lines = {n.op: _at(gw, n.site) for n in gw.trace.nodes.values() if not n.site_inferred}
    assert lines == {
        "AddmmBackward0": (THIS_FILE, _line("model call")),
        "GeluBackward0": (THIS_FILE, _line("model call")),
        "LogSoftmaxBackward0": (THIS_FILE, _line("loss")),
        "NllLossBackward0": (THIS_FILE, _line("loss")),
    }


def _composite(kind: str):
    """(graph input, outputs, marked line) for one composite op; outputs are consumed on a later line."""
    torch.manual_seed(0)
    w = torch.randn(5, 5, requires_grad=True)
    x = torch.randn(2, 5) @ w  # the op's input comes from an earlier line
    if kind == "LSTMCell":
        cell = nn.LSTMCell(5, 5)
        outs = cell(x, (x.tanh(), x.sigmoid()))  # <mark: LSTMCell>
    elif kind == "layer_norm":
        outs = (F.layer_norm(x, (5,), w[0], w[1]),)  # <mark: layer_norm>
    elif kind == "normalize":
        outs = (F.normalize(x, dim=-1),)  # <mark: normalize>
    elif kind == "einsum":
        outs = (torch.einsum("ij,kj->ik", x, x),)  # <mark: einsum>
    elif kind == "cosine_similarity":
        outs = (F.cosine_similarity(x, x.flip(0), dim=-1),)  # <mark: cosine_similarity>
    return x, outs, _line(kind)


@pytest.mark.parametrize("kind", ["layer_norm", "normalize", "LSTMCell", "einsum", "cosine_similarity"])
def test_every_node_made_by_a_composite_op_is_tagged_with_its_call_line(kind):
    """At the precise level every node, saving tensors or not, first or last, has its call's line."""
    with _watch(level="precise") as gw:
        x, outs, line = _composite(kind)
        first = x.grad_fn._sequence_nr()
        last = max(o.grad_fn._sequence_nr() for o in outs)
        loss = sum((o * o).sum() for o in outs)  # consumed on another line, by ops that save tensors
        loss.backward()
    made = [n for n in gw.trace.nodes.values() if first < n.seq <= last]  # nodes are numbered in creation order
    assert len(made) >= 3
    wrong = [(n.op, gw.trace.where(n.site), n.site_inferred) for n in made if _at(gw, n.site) != (THIS_FILE, line)]
    assert not wrong


@pytest.mark.parametrize("kind", ["LSTMCell", "layer_norm", "normalize", "einsum", "cosine_similarity"])
def test_nodes_of_a_composite_op_that_save_tensors_have_its_exact_line(kind):
    """Whatever inference does for nodes that save nothing, a node with its own saved tensors is never wrong."""
    with _watch() as gw:
        x, outs, line = _composite(kind)
        first = x.grad_fn._sequence_nr()
        last = max(o.grad_fn._sequence_nr() for o in outs)
        sum((o * o).sum() for o in outs).backward()
    saving = [n for n in gw.trace.nodes.values() if first < n.seq <= last and n.saved]
    assert saving
    assert all(not n.site_inferred and _at(gw, n.site) == (THIS_FILE, line) for n in saving)
    # nodes without saved tensors got a neighbour's line, and say so
    assert all(n.site_inferred for n in gw.trace.nodes.values() if not n.saved and n.site is not None)


# ----------------------------------------------------------------- steps
def test_each_node_belongs_to_the_step_that_created_it():
    x = torch.randn(4, requires_grad=True)
    with _watch(level="precise") as gw:  # a record for every node, not only where the default looks closer
        with gw.step():
            kept = x.exp()  # made in step 0, backwarded in step 2
            x.sin().sum().backward()
        with gw.step():
            x.cos().sum().backward()
        with gw.step():
            kept.tan().sum().backward()
    steps = Counter((n.op, n.step) for n in gw.trace.nodes.values())
    assert steps == Counter(
        {
            ("SinBackward0", 0): 1,
            ("ExpBackward0", 0): 1,
            ("SumBackward0", 0): 1,
            ("CosBackward0", 1): 1,
            ("SumBackward0", 1): 1,
            ("TanBackward0", 2): 1,
            ("SumBackward0", 2): 1,
        }
    )
    assert {s.step for s in gw.trace.saved.values() if gw.trace.nodes[s.node].op == "ExpBackward0"} == {0}


def test_step_records_count_nodes_created_and_saved_tensors():
    w = torch.randn(3, requires_grad=True)
    with _watch() as gw:
        for n_ops in (1, 2, 3):
            with gw.step():
                y = w
                for _ in range(n_ops):
                    y = y.exp()  # one node and one saved output per exp
                y.sum().backward()  # plus SumBackward0
    assert [s.nodes_created for s in gw.trace.steps] == [2, 3, 4]
    assert [s.saved_packed for s in gw.trace.steps] == [1, 2, 3]
    assert [s.saved_bytes_packed for s in gw.trace.steps] == [12, 24, 36]
    assert [s.index for s in gw.trace.steps] == [0, 1, 2]
    assert all(s.rss_bytes > 0 for s in gw.trace.steps)
    assert all(s.live_saved_bytes == 0 for s in gw.trace.steps)


def test_trace_memory_is_bounded_with_keep_steps():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with _watch(keep_steps=5, level="precise") as gw:  # the level that builds every step's records
        for _ in range(50):
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()  # 7 nodes, 5 saved tensors per step
            opt.step()
    trace = gw.trace
    assert len(trace.steps) == 50 and [s.index for s in trace.steps] == list(range(50))
    assert len(trace.backwards) == 50
    assert all(s.nodes_created == 7 and s.saved_packed == 5 for s in trace.steps)  # aggregates of every step
    recent = set(range(45, 50))
    # per-node detail: the last 5 steps, plus step 0 (kept with the session's first snapshot)
    assert Counter(n.step for n in trace.nodes.values()) == Counter({s: 7 for s in recent | {0}})
    assert Counter(s.step for s in trace.saved.values()) == Counter({s: 5 for s in recent | {0}})
    assert [s.index for s in trace.steps if not s.detail] == list(range(1, 45))


def test_full_detail_builds_records_only_where_it_looks_closer():
    """What a step seen in full detail records (here every step, ``level="full"``; at the default level the
    first steps, sampled ones and suspicious ones: ``test_adaptive.py``)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with _watch(level="full") as gw:
        for i in range(6):
            opt.zero_grad()
            loss = model(torch.randn(8, 4)).pow(2).mean()  # 7 nodes, 5 saved tensors per step
            loss.backward(retain_graph=i == 3)  # step 3 keeps its graph: the full walk, and records
            opt.step()
        kept = model(torch.randn(8, 4)).sum()  # <mark: outlives its step>
        opt.step()  # ends step 6 with kept's saved tensors alive
    assert kept.grad_fn is not None  # `kept` held its graph through step 6's end
    trace = gw.trace
    assert all(s.nodes_created == 7 and s.saved_packed == 5 for s in trace.steps[:6])  # every step is counted
    assert [b.nodes_reached for b in trace.backwards] == [7] * 6  # quick walks count too
    # node records: step 0 (the first backward), step 3 (retain_graph), each backward's root (MeanBackward0);
    # at step 6's end step 5's `loss` is still alive, so the holder search walks it (on to PowBackward0, whose
    # buffers step 5's quick-walked backward freed: the walk stops there) and kept's graph (6 nodes); the
    # census at the ends of steps 1, 2 and 4 (every graph the frames reach) walks that step's `loss` the same way
    nodes = sorted(Counter(n.step for n in trace.nodes.values()).items())
    assert nodes == [(0, 7), (1, 2), (2, 2), (3, 7), (4, 2), (5, 2), (6, 6)]
    pow_node = next(n for n in trace.nodes.values() if n.step == 5 and n.op == "PowBackward0")
    assert pow_node.freed_by == 5 and pow_node.backward == 5
    assert sorted(Counter(s.step for s in trace.saved.values()).items()) == [(0, 5), (3, 5), (6, 4)]
    outliving = [s for s in trace.saved.values() if s.step == 6]
    assert all(s.alive and trace.nodes[s.node].step == 6 for s in outliving)  # linked by the holder search
    assert {_at(gw, s.site)[1] for s in outliving} == {_line("outlives its step")}
    assert trace.steps[6].saved_alive_by_step == {6: sum(s.nbytes for s in outliving if s.kind != "parameter")}
