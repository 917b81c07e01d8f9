"""The live tables by step: split into recent and old parts, they read exactly as one table would."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from graphwatch.capture.steps import live_steps
from graphwatch.capture.steps.live_steps import LiveSteps
from graphwatch.model import StepTable

# (operation, step offset back from the current step); offsets reach past two batches into the old tables
_OPS = st.lists(
    st.tuples(st.sampled_from(["born", "died", "bytes+", "bytes-", "advance", "look"]), st.integers(0, 40)),
    max_size=400,
)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(_OPS)
def test_split_tables_read_as_one_table(ops: list[tuple[str, int]]) -> None:
    batch, live_steps.OLD_BATCH = live_steps.OLD_BATCH, 4  # small batches: steps move to the old part often
    try:
        live, nodes, saved = LiveSteps(), {}, {}
        alive_before: set[int] = set()  # alive at the last look
        step = 0
        for op, back in ops:
            target = max(0, step - back)
            if op == "born":
                live.node_born(target)
                nodes[target] = nodes.get(target, 0) + 1
            elif op == "died" and nodes.get(target):
                live.node_died(target)
                nodes[target] -= 1
            elif op == "bytes+":
                live.count_bytes(8, target)
                saved[target] = saved.get(target, 0) + 8
            elif op == "bytes-" and saved.get(target):
                live.count_bytes(-8, target)
                saved[target] -= 8
            elif op == "advance":
                step += 1
                live.advance(step)
            elif op == "look":
                got_nodes, got_saved = live.snapshot()
                assert isinstance(got_nodes, StepTable)
                assert dict(got_nodes) == {s: n for s, n in nodes.items() if n}
                assert dict(got_saved) == {s: b for s, b in saved.items() if b}
                appeared, vanished = live.changes()
                alive = {s for s in set(nodes) | set(saved) if nodes.get(s) or saved.get(s)}
                # what a holder search relies on: a step alive now and not at the last look is reported as
                # come alive, a step alive then and dead now as died
                assert alive - alive_before <= set(appeared) and alive_before - alive <= set(vanished)
                alive_before = alive
                assert all(live.is_alive(s) == (s in alive) for s in range(step + 1))
            assert live.nodes_total == sum(nodes.values()) and live.activation_total == sum(saved.values())
    finally:
        live_steps.OLD_BATCH = batch


def test_a_snapshot_keeps_its_values_when_the_tables_change_later() -> None:
    live = LiveSteps()
    for step in range(3 * live_steps.OLD_BATCH):
        live.node_born(step)
        live.advance(step + 1)
    before, _ = live.snapshot()
    live.node_died(0)  # an old step's graph dies
    live.node_born(live.boundary + 1)
    after, _ = live.snapshot()
    assert before[0] == 1 and 0 not in after
    assert before[live.boundary + 1] == 1 and after[live.boundary + 1] == 2
