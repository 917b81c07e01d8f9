"""``model.eval()`` and ``model.train()`` as the default level's signal of a new code path.

The patch of ``nn.Module.train`` reports each outermost call that changes a
module's mode and changes nothing else; a session turns a step that has made
nothing yet to full detail at a switch at a new line, and holds the steps after
it in full detail either way.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import graphwatch
from graphwatch.capture.detail import HOLD_STEPS
from graphwatch.capture.mode_switch import ModeSwitchPatch

pytestmark = pytest.mark.usefixtures("one_thread")  # (conftest: one torch thread, no session left)


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Sequential(nn.BatchNorm1d(8), nn.Linear(8, 1)))


# ------------------------------------------------------------------ the patch
def test_only_the_outermost_call_that_changes_a_mode_is_reported() -> None:
    net, seen = model(), []
    with ModeSwitchPatch(lambda module, mode: seen.append((module, mode))):
        net.eval()  # its children's train(False) calls are not reported
        net.eval()  # no change
        net[2].train()  # a child alone
        net.train()
        net.train(True)
    assert seen == [(net, False), (net[2], True), (net, True)]
    assert all(m.training for m in net.modules())


def test_modes_and_errors_are_torchs_own_under_the_patch() -> None:
    net = model()
    with ModeSwitchPatch(lambda module, mode: None):
        assert net.eval() is net and not any(m.training for m in net.modules())
        with pytest.raises(ValueError) as watched:
            net.train("yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError) as bare:
        net.train("yes")  # type: ignore[arg-type]
    assert str(watched.value) == str(bare.value)


def test_nested_patches_restore_what_each_replaced() -> None:
    original = nn.Module.train
    outer = ModeSwitchPatch(lambda module, mode: None).install()
    inner = ModeSwitchPatch(lambda module, mode: None).install()
    inner.remove()
    assert nn.Module.train is not original
    outer.remove()
    assert nn.Module.train is original


# ------------------------------------------------------------------ the session
def steps_with_a_switch(switch_at: int, made_first: bool, steps: int = 40) -> None:
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    for step in range(steps):
        if step == switch_at:
            if made_first:
                net(torch.randn(4, 4)).sum()  # a forward of this step before the switch
            net.eval()
            net.train()
        opt.zero_grad()
        net(torch.randn(4, 4)).pow(2).mean().backward()
        opt.step()


def spans(gw: graphwatch.Session) -> list[tuple[int, int, str]]:
    return [(span.first, span.end, span.reason) for span in gw.trace.full_detail]


def test_a_switch_before_anything_of_its_step_is_made_sees_that_step_and_the_next_in_full_detail() -> None:
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        steps_with_a_switch(20, made_first=False)
    switch = next(span for span in spans(gw) if span[0] >= 3)
    assert switch[:2] == (20, 20 + HOLD_STEPS + 1) and "switched to evaluation mode at " in switch[2]
    assert gw.trace.steps[20].saved_packed > 0  # its saved tensors went through the pack hook


def test_a_switch_after_its_step_made_nodes_leaves_that_step_light_and_holds_the_next() -> None:
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        steps_with_a_switch(20, made_first=True)
    switch = next(span for span in spans(gw) if span[0] >= 3)
    assert switch[:2] == (21, 20 + HOLD_STEPS + 1) and "switched to evaluation mode at " in switch[2]
    assert gw.trace.steps[20].saved_packed == 0


def test_a_switch_at_a_line_seen_before_is_no_signal() -> None:
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        steps_with_a_switch(1, made_first=False)  # seen on a step in full detail: learnt there
    assert [span[2] for span in spans(gw)] == ["first steps"]


def test_the_light_and_full_levels_leave_module_train_alone() -> None:
    for level in ("light", "full"):
        with graphwatch.watch(summary=False, level=level):
            assert nn.Module.train.__module__ == "torch.nn.modules.module"


def test_a_mode_switch_inside_a_compiled_function_breaks_no_more_graphs() -> None:
    import torch._dynamo as dynamo

    net = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1))
    x = torch.randn(2, 4)

    def evaluate(x: torch.Tensor) -> torch.Tensor:
        net.eval()
        y = net(x)
        net.train()
        return y.sum()

    dynamo.reset()
    bare = dynamo.explain(evaluate)(x).graph_break_count
    with graphwatch.watch(summary=False):
        dynamo.reset()
        watched = dynamo.explain(evaluate)(x).graph_break_count
    dynamo.reset()
    assert watched == bare == 0
