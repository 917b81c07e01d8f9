"""``model.eval()`` as the default level's signal of a new code path, a first validation pass.

The patch of ``nn.Module.eval`` reports each call that switches a training
module to evaluation and changes nothing else; a session turns a step that has
made nothing yet to full detail at such a switch at a new line, and holds the
steps after it in full detail either way.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import graphwatch
from graphwatch.capture.hooks.eval_mode import EvalModePatch
from graphwatch.capture.steps.detail import HOLD_STEPS

pytestmark = pytest.mark.usefixtures("one_thread")  # (conftest: one torch thread, no session left)


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Sequential(nn.BatchNorm1d(8), nn.Linear(8, 1)))


# ------------------------------------------------------------------ the patch
def test_each_switch_of_a_training_module_to_evaluation_is_reported_once() -> None:
    net, seen = model(), []
    with EvalModePatch(seen.append):
        net.eval()  # (its children are switched by Module.train: not reported)
        net.eval()  # no change
        net.train()
        net[2].eval()  # a child alone
        net.train(False)  # not eval(): not reported
    assert seen == [net, net[2]]
    assert not any(m.training for m in net.modules())


def test_modes_are_torchs_own_under_the_patch() -> None:
    net = model()
    with EvalModePatch(lambda module: None):
        assert net.eval() is net and not any(m.training for m in net.modules())
        assert nn.Module.train.__module__ == "torch.nn.modules.module"  # (train, which recurses, is left alone)


def test_nested_patches_restore_what_each_replaced() -> None:
    original = nn.Module.eval
    outer = EvalModePatch(lambda module: None).install()
    inner = EvalModePatch(lambda module: None).install()
    inner.remove()
    assert nn.Module.eval is not original
    outer.remove()
    assert nn.Module.eval is original


def test_a_switch_inside_code_torch_compile_traces_is_not_reported() -> None:
    import torch._dynamo as dynamo

    net, seen = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1)), []

    def evaluate(x: torch.Tensor) -> torch.Tensor:
        net.eval()
        y = net(x)
        net.train()
        return y.sum()

    with EvalModePatch(seen.append):
        dynamo.reset()
        dynamo.explain(evaluate)(torch.randn(2, 4))
    dynamo.reset()
    assert seen == []


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


def test_the_light_and_full_levels_leave_module_eval_alone() -> None:
    for level in ("light", "full"):
        with graphwatch.watch(summary=False, level=level):
            assert nn.Module.eval.__module__ == "torch.nn.modules.module"


def test_a_switch_inside_a_compiled_function_breaks_no_more_graphs() -> None:
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
