"""A long run with a periodic leak: graphwatch's own records stay bounded and its trace grows linearly.

2,000 steps of a tiny training loop in which every 100th step keeps its loss
(``kept.append(loss)``: 20 graphs leak, one every 100 steps), watched with
``keep_steps=10`` and every step in full detail (``level="full"``: the most
records a session keeps; the default level's sampled steps are checked in
``test_adaptive.py``).  What must hold:

* the per-node records (``trace.nodes``, ``trace.saved``) stay within the
  window of recent steps plus the steps kept for their findings, however long
  the run;
* the leak gives one merged finding, not one per leaking step;
* every step still has its totals (the per-step table and charts are complete);
* the JSON trace grows linearly, by under 200 bytes per step, and a step
  record does not grow with the number of graphs leaked so far.

The 100,000-step figure (and timings) belong to the benchmark; no timing is asserted here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn as nn

import graphwatch
from graphwatch.model.trace_io import _plain

pytestmark = pytest.mark.usefixtures("no_session_left")

STEPS = 2000
LEAK_EVERY = 100
KEEP_STEPS = 10
CHECKPOINTS = (1000, 1500, 2000)
NODES_PER_STEP = 7  # Linear, Tanh, Linear, pow, mean: AddmmBackward0 x2, TBackward0 x2, Tanh, Pow, Mean
SAVED_PER_STEP = 5
BYTES_PER_STEP = 200  # upper bound for the JSON trace's growth per step (settled steps are columns)


@dataclass
class LongRun:
    session: graphwatch.Session
    sizes: dict[int, int] = field(default_factory=dict)  # step count -> JSON bytes
    # the same, less the resident-memory column: the machine's figure, one number while it stays put and one
    # per step once it moves (in a test worker, when memory another test used comes back): a jump, not growth
    sizes_less_rss: dict[int, int] = field(default_factory=dict)
    most_nodes: int = 0
    most_saved: int = 0
    nodes_at: dict[int, int] = field(default_factory=dict)
    kept: list = field(default_factory=list)


@pytest.fixture(scope="module")
def long_run(tmp_path_factory) -> LongRun:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    folder = tmp_path_factory.mktemp("long")
    kept = []
    with graphwatch.watch(summary=False, keep_steps=KEEP_STEPS, level="full") as gw:
        run = LongRun(gw)
        for step in range(STEPS):
            opt.zero_grad()
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            opt.step()
            if step % LEAK_EVERY == LEAK_EVERY - 1:
                kept.append(loss)  # the leak: this step's graph stays alive
            if step % 50 == 0:
                run.most_nodes = max(run.most_nodes, len(gw.trace.nodes))
                run.most_saved = max(run.most_saved, len(gw.trace.saved))
            if step + 1 in CHECKPOINTS:
                path = gw.save(folder / f"trace-{step + 1}.json")
                run.sizes[step + 1] = path.stat().st_size
                rss = json.loads(path.read_text())["steps"]["columns"]["rss_bytes"]
                run.sizes_less_rss[step + 1] = run.sizes[step + 1] - len(json.dumps(rss))
                run.nodes_at[step + 1] = len(gw.trace.nodes)
    run.kept = kept
    return run


def test_every_step_keeps_its_totals(long_run):
    steps = long_run.session.trace.steps
    assert [s.index for s in steps] == list(range(STEPS))
    assert all(s.source == "optimizer" for s in steps)
    assert all(s.nodes_created == NODES_PER_STEP and s.saved_packed == SAVED_PER_STEP for s in steps)
    assert len(long_run.session.trace.backwards) == STEPS


def test_per_node_records_stay_within_the_window(long_run):
    trace = long_run.session.trace
    detailed = {s.index for s in trace.steps if s.detail}
    # the window, the step being recorded, and the steps kept for a finding (few: the leak's finding is merged)
    assert len(detailed) <= KEEP_STEPS + 1 + 5, sorted(detailed)
    assert long_run.most_nodes <= NODES_PER_STEP * len(detailed) + NODES_PER_STEP
    assert long_run.most_saved <= SAVED_PER_STEP * len(detailed) + SAVED_PER_STEP
    assert long_run.nodes_at[1000] == long_run.nodes_at[2000]  # flat, not growing with the run
    assert {n.step for n in trace.nodes.values()} <= detailed | {-1}


def test_the_periodic_leak_is_one_merged_finding(long_run):
    findings = long_run.session.findings
    kept_alive = [f for f in findings if f.kind == "graph-kept-alive"]
    assert len(kept_alive) == 1, [str(f) for f in findings]
    assert len(findings) <= 3, [f.kind for f in findings]  # and, at the end, the memory growth it causes
    # one kept graph could be a variable's last value: first seen when a second one (step 199's) outlived
    # the one-step lag, at step 201 (README, "How steps are counted")
    assert kept_alive[0].step == 2 * LEAK_EVERY + 1
    assert len(long_run.kept) == STEPS // LEAK_EVERY


def test_the_trace_grows_linearly_by_under_200_bytes_per_step(long_run):
    sizes, steady = long_run.sizes, long_run.sizes_less_rss
    first, second = (steady[1500] - steady[1000]) / 500, (steady[2000] - steady[1500]) / 500
    assert sizes[2000] / STEPS < BYTES_PER_STEP, sizes
    assert second < BYTES_PER_STEP, (first, second)
    assert second <= first * 1.2, f"bytes per step grow: {first:.0f} then {second:.0f}"


def test_a_step_record_does_not_grow_with_the_graphs_leaked_so_far(long_run):
    trace = long_run.session.trace
    early, late = (len(json.dumps(_plain(trace.steps[i]))) for i in (500, STEPS - 50 - 2 * KEEP_STEPS))
    assert late <= early * 1.2, (early, late)


def test_the_long_trace_loads_back(long_run, tmp_path):
    path = long_run.session.save(tmp_path / "trace.json")
    loaded = graphwatch.load(path)
    assert len(loaded.steps) == STEPS and [f.kind for f in loaded.findings] == [f.kind for f in long_run.session.findings]


def test_looking_for_holders_costs_what_the_step_added_not_what_is_kept():
    """``total_loss += loss`` keeps one more graph each step; the holder search at a step end walks only the
    new part and reuses what it found below the last step's ``total_loss`` (issue: it re-walked every kept
    graph, so each step cost more than the one before)."""
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    looked_at = []
    with graphwatch.watch(summary=False, level="full") as gw:  # a holder search at every step end
        total_loss = 0
        for _ in range(40):
            loss = model(torch.randn(2, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total_loss += loss
            looked_at.append(sum(r.looked_at for r in gw._step_ends._holders._reaches.values()))
    assert max(looked_at[5:]) <= 8, looked_at  # the same few nodes each step: the new `+`, the new loss
    finding = next(f for f in gw.findings if f.kind == "graph-kept-alive")
    assert finding.evidence["holder"] == "total_loss"
    assert finding.evidence["kept"]["spans"] == [[0, 38]]  # every kept step, refreshed at the session's end
