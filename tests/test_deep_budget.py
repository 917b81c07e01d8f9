"""Past the budget of tracked tensors a step, saved tensors and nodes are counted, not tracked: and stay
exactly what torch makes of them.

The budget (100,000 a step) is lowered to 50 here, so that a chain of a few hundred ops crosses it.
Each test compares the program under graphwatch with the same program bare.
"""

from __future__ import annotations

import io

import pytest
import torch

import graphwatch
from graphwatch.capture import recorder as recorder_module
from graphwatch.rendering.terminal import make_console, print_summary
from graphwatch.rendering.wording import counted_only_text

BUDGET = 50
LINKS = 200  # two nodes and three saved tensors a link: far past the budget


@pytest.fixture(autouse=True)
def small_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recorder_module, "TRACKED_PER_STEP", BUDGET)


def _chain(w: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    for _ in range(LINKS):
        h = torch.tanh(h @ w)
    return h.sum()


def _grads(watched: bool) -> tuple[torch.Tensor, torch.Tensor, graphwatch.Session | None]:
    torch.manual_seed(0)
    w = torch.randn(8, 8, requires_grad=True)
    h = torch.randn(2, 8, requires_grad=True)
    if not watched:
        _chain(w, h).backward()
        return w.grad, h.grad, None  # type: ignore[return-value]
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        _chain(w, h).backward()
    return w.grad, h.grad, gw  # type: ignore[return-value]


def test_gradients_past_the_budget_are_bit_identical() -> None:
    bare_w, bare_h, _ = _grads(watched=False)
    w, h, _ = _grads(watched=True)
    assert torch.equal(w, bare_w) and torch.equal(h, bare_h)


def test_the_trace_says_what_was_counted_not_tracked() -> None:
    *_, gw = _grads(watched=True)
    assert gw is not None
    step, backward = gw.trace.steps[0], gw.trace.backwards[0]
    assert step.saved_packed == 3 * LINKS and step.saved_counted_only == 3 * LINKS - BUDGET
    assert backward.nodes_reached == 2 * LINKS + 1 and backward.nodes_counted_only == 2 * LINKS + 1 - BUDGET
    notice = counted_only_text(gw.trace)
    assert f"saved {3 * LINKS - BUDGET} tensors" in notice and "counted" in notice
    out = io.StringIO()
    print_summary(gw.trace, make_console(out))
    assert notice in " ".join(out.getvalue().split())


def test_a_step_under_the_budget_is_tracked_whole() -> None:
    model = torch.nn.Linear(4, 4)
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        model(torch.randn(2, 4)).tanh().sum().backward()
    step, backward = gw.trace.steps[0], gw.trace.backwards[0]
    assert step.saved_counted_only == 0 and backward.nodes_counted_only == 0 and step.saved_bytes_packed > 0
    assert counted_only_text(gw.trace) == ""


def _past_the_budget(x: torch.Tensor) -> torch.Tensor:
    """x run through enough ops that save a tensor that what follows is past the budget."""
    for _ in range(BUDGET):
        x = torch.tanh(x)
    return x


def test_an_in_place_change_past_the_budget_raises_torchs_error() -> None:
    def run() -> None:
        x = _past_the_budget(torch.ones(3, requires_grad=True))
        y = x.exp()
        y.add_(1)
        y.sum().backward()

    with pytest.raises(RuntimeError) as bare:
        run()
    with graphwatch.watch(summary=False, snapshots="off"), pytest.raises(RuntimeError) as watched:
        run()
    assert str(watched.value).startswith(str(bare.value).split("\n")[0])
    assert "modified by an inplace operation" in str(watched.value)


def test_a_saved_input_past_the_budget_is_the_tensor_itself() -> None:
    seen = {}

    class Keep(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):  # type: ignore[no-untyped-def, override]
            ctx.save_for_backward(x)
            return x * 2

        @staticmethod
        def backward(ctx, grad):  # type: ignore[no-untyped-def, override]
            seen["saved"] = ctx.saved_tensors[0]
            return grad * 2

    with graphwatch.watch(summary=False, snapshots="off") as gw:
        x = _past_the_budget(torch.ones(3, requires_grad=True))
        Keep.apply(x).sum().backward()
    assert seen["saved"] is x and gw.trace.steps[0].saved_counted_only > 0


def test_per_tensor_hooks_and_save_on_cpu_past_the_budget_keep_working() -> None:
    calls = []

    def run() -> torch.Tensor:
        torch.manual_seed(1)
        a = torch.randn(4, requires_grad=True)
        y = _past_the_budget(a).exp()
        y.grad_fn._raw_saved_result.register_hooks(  # type: ignore[union-attr]
            lambda t: (calls.append("pack"), t.clone())[1], lambda t: (calls.append("unpack"), t)[1]
        )
        with torch.autograd.graph.save_on_cpu():
            z = _past_the_budget(y).sin().sum()
        z.backward()
        return a.grad  # type: ignore[return-value]

    bare = run()
    bare_calls, calls[:] = list(calls), []
    with graphwatch.watch(summary=False, snapshots="off"):
        watched = run()
    assert torch.equal(watched, bare) and calls == bare_calls == ["pack", "unpack"]


def test_a_graph_carried_across_steps_is_still_found_past_the_budget() -> None:
    torch.manual_seed(0)
    w = torch.randn(8, 8, requires_grad=True)
    h = torch.zeros(1, 8)
    with graphwatch.watch(summary=False, snapshots="off") as gw:
        for _ in range(3):
            for _ in range(LINKS // 2):
                h = torch.tanh(h @ w + 0.1)
            h.sum().backward(retain_graph=True)  # the hidden state is never detached
            gw.end_step()
    assert any(s.saved_counted_only for s in gw.trace.steps)
    assert "graph-carried-across-steps" in {f.kind for f in gw.findings}, gw.findings
