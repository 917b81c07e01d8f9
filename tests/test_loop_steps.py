"""Steps follow the user's training loop (README, "How steps are counted"), and normal lag is not a leak.

Each loop is a small real training program; the correct version must be
silent and the buggy one named with the right kind, variable and line
(lines are found by their ``# at: <tag>`` comments).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest
import torch
from torch import nn

import graphwatch
from graphwatch.model import Finding

LEAKS = {"graph-carried-across-steps", "retained-graph", "graph-kept-alive", "memory-growth"}


def watch() -> graphwatch.Session:
    return graphwatch.watch(summary=False, snapshots="off")


def leaks(findings: list[Finding]) -> list[str]:
    return [str(f) for f in findings if f.kind in LEAKS]


def net(inputs: int = 4, outputs: int = 1) -> nn.Module:
    return nn.Sequential(nn.Linear(inputs, 8), nn.Tanh(), nn.Linear(8, outputs))


# --------------------------------------------------------------- the programs
def gan(iterations: int = 6) -> None:
    torch.manual_seed(0)
    G, D = net(4, 2), net(2, 1)
    opt_d, opt_g = torch.optim.Adam(D.parameters()), torch.optim.Adam(G.parameters())
    bce = nn.BCEWithLogitsLoss()
    for _ in range(iterations):
        D.zero_grad()
        err_d_real = bce(D(torch.randn(8, 2)), torch.ones(8, 1))
        err_d_real.backward()
        fake = G(torch.randn(8, 4))
        err_d_fake = bce(D(fake.detach()), torch.zeros(8, 1))
        err_d_fake.backward()
        err_d = err_d_real + err_d_fake  # noqa: F841 (kept for logging, as in the upstream DCGAN loop)
        opt_d.step()
        G.zero_grad()
        err_g = bce(D(fake), torch.ones(8, 1))
        err_g.backward()
        opt_g.step()


def wgan(iterations: int = 21, n_critic: int = 5) -> None:
    torch.manual_seed(0)
    G, D = net(4, 2), net(2, 1)
    opt_d, opt_g = torch.optim.Adam(D.parameters()), torch.optim.Adam(G.parameters())
    for i in range(iterations):
        opt_d.zero_grad()
        d_loss = -D(torch.randn(8, 2)).mean() + D(G(torch.randn(8, 4)).detach()).mean()
        d_loss.backward()
        opt_d.step()
        opt_g.zero_grad()
        if i % n_critic == 0:
            g_loss = -D(G(torch.randn(8, 4))).mean()  # kept until the next generator step
            g_loss.backward()
            opt_g.step()


def lbfgs(iterations: int = 4, keep_result: bool = False) -> None:
    torch.manual_seed(0)
    model, x, y = net(3, 1), torch.randn(16, 3), torch.randn(16, 1)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=6)
    for _ in range(iterations):

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = (model(x) - y).pow(2).mean()
            loss.backward()
            return loss

        if keep_result:
            loss = opt.step(closure)  # noqa: F841 (the documented pattern)
        else:
            opt.step(closure)


def accumulation(iterations: int = 12, every: int = 4) -> None:
    torch.manual_seed(0)
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(iterations):
        loss = model(torch.randn(8, 4)).pow(2).mean() / every
        loss.backward()
        if (i + 1) % every == 0:
            opt.step()
            opt.zero_grad()


def no_optimizer(iterations: int = 6, retain: bool = False) -> None:
    torch.manual_seed(0)
    model = net()
    for _ in range(iterations):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        model.zero_grad()
        loss.backward(retain_graph=retain)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-0.01)


def optimizer_only_with_a_flag(iterations: int = 5, use_optimizer: bool = False) -> None:
    """As in PyTorch's word-language-model example: the optimizer exists only with a command-line flag."""
    torch.manual_seed(0)
    model = net()
    if use_optimizer:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(iterations):
        model.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        if use_optimizer:
            optimizer.step()
        else:
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-0.01)


def several_losses(iterations: int = 5) -> None:
    torch.manual_seed(0)
    model = net(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(iterations):
        out = model(torch.randn(8, 4))
        losses = [out[:, 0].pow(2).mean(), out[:, 1].abs().mean()]
        opt.zero_grad()
        for k, loss in enumerate(losses):
            loss.backward(retain_graph=k < len(losses) - 1)
        opt.step()


def grad_then_backward(iterations: int = 3) -> None:
    torch.manual_seed(0)
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(iterations):
        x = torch.randn(8, 4, requires_grad=True)
        loss = model(x).pow(2).mean()
        (g,) = torch.autograd.grad(loss, x, create_graph=True)
        (loss + g.pow(2).sum()).backward()
        opt.step()
        opt.zero_grad()


def train_step(model: nn.Module, opt: torch.optim.Optimizer, chunks: torch.Tensor) -> None:
    opt.zero_grad()
    for chunk in chunks:
        model(chunk).pow(2).mean().backward()
    opt.step()


def step_function_loop(iterations: int = 4) -> None:
    torch.manual_seed(0)
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(iterations):
        train_step(model, opt, torch.randn(3, 8, 4))


GLOBAL_GRAPH: list[torch.Tensor] = []


def global_graph_before_training(iterations: int = 8) -> None:
    torch.manual_seed(0)
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    GLOBAL_GRAPH.append(model(torch.ones(1, 4)).sum())  # a graph made once, before the loop, never growing
    for _ in range(iterations):
        opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
    GLOBAL_GRAPH.clear()


def validation_kept(iterations: int = 8, every: int = 4) -> None:
    torch.manual_seed(0)
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x_val = torch.randn(64, 4)
    for i in range(iterations):
        opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
        if i % every == 0:
            val_loss = model(x_val).pow(2).mean()  # at: validation
            print(f"validation {val_loss.item():.3f}")


def ring_of_two(iterations: int = 10) -> None:
    torch.manual_seed(0)
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    recent: list[torch.Tensor] = []
    for _ in range(iterations):
        opt.zero_grad()
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        recent = [*recent[-1:], loss]  # the last two losses, for a smoothed log


def growing_list(iterations: int = 8) -> None:
    torch.manual_seed(0)
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    history = []
    for _ in range(iterations):
        opt.zero_grad()
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        history.append(loss)  # at: kept


# ------------------------------------------------------------------ the tests
@pytest.mark.parametrize(
    ("program", "steps"),
    [
        (gan, 6),
        (lambda: wgan(21, 5), 5),  # one step per generator step (the first iteration is one)
        (lbfgs, 4),
        (lambda: lbfgs(keep_result=True), 4),
        (accumulation, 3),
        (no_optimizer, 6),
        (several_losses, 5),
        (optimizer_only_with_a_flag, 5),
        (lambda: optimizer_only_with_a_flag(use_optimizer=True), 5),
        (grad_then_backward, 3),
        (step_function_loop, 4),
        (global_graph_before_training, 8),
        (ring_of_two, 10),
    ],
    ids=lambda p: getattr(p, "__name__", str(p)),
)
def test_correct_loop_is_one_step_per_iteration_and_silent(program: object, steps: int) -> None:
    with watch() as gw:
        program()  # type: ignore[operator]
    assert len(gw.trace.steps) == steps, [s.source for s in gw.trace.steps]
    assert leaks(gw.findings) == []


def test_needless_retain_graph_without_optimizer_is_one_step_per_iteration_and_reported() -> None:
    with watch() as gw:
        no_optimizer(retain=True)
    assert len(gw.trace.steps) == 6
    assert {f.kind for f in gw.findings} == {"retained-graph"}


def test_validation_every_step_kept_one_step_is_lag_not_a_leak() -> None:
    with watch() as gw:
        validation_kept(iterations=8, every=1)
    assert leaks(gw.findings) == []


def test_validation_graph_held_for_several_steps_is_kept_alive(at: Callable[[object, str], str]) -> None:
    with watch() as gw:
        validation_kept(iterations=9, every=4)
    finding = next(f for f in gw.findings if f.kind == "graph-kept-alive")
    assert finding.evidence["holder"] == "val_loss"
    assert at(validation_kept, "validation") in finding.evidence["sites"]
    assert "no_grad" in finding.fix  # the validation forward is never backwarded: no_grad is safe there


def test_growing_list_is_kept_alive_at_the_append(at: Callable[[object, str], str]) -> None:
    with watch() as gw:
        growing_list()
    finding = next(f for f in gw.findings if f.kind == "graph-kept-alive")
    assert finding.evidence["holder"] == "history"
    assert finding.evidence["sites"][0] == at(growing_list, "kept")
    assert "history.append(loss.item())" in finding.fix


def ema_teacher(iterations: int = 10, no_grad_update: bool = True) -> None:
    torch.manual_seed(0)
    student, teacher = net(), net()
    teacher.load_state_dict(student.state_dict())
    for p in teacher.parameters():
        p.requires_grad_(False)
    opt = torch.optim.SGD(student.parameters(), lr=0.01)
    for _ in range(iterations):
        x = torch.randn(8, 4)
        with torch.no_grad():
            target = teacher(x)
        loss = (student(x) - target).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if no_grad_update:
            with torch.no_grad():
                for tp, sp in zip(teacher.parameters(), student.parameters()):
                    tp.mul_(0.99).add_(0.01 * sp)
        else:
            for tp, sp in zip(teacher.parameters(), student.parameters()):
                tp.mul_(0.99).add_(0.01 * sp)  # records a graph: it grows every step, and nothing walks it


def test_ema_update_under_no_grad_is_silent() -> None:
    with watch() as gw:
        ema_teacher()
    assert gw.findings == []


def test_ema_update_without_no_grad_counts_graphs_no_backward_walks() -> None:
    with watch() as gw:
        ema_teacher(no_grad_update=False)
    nodes = [s.live_nodes for s in gw.trace.steps]
    assert nodes[-1] > nodes[2] > nodes[0], nodes  # the chain's nodes count, though no backward reaches them
    finding = next(f for f in gw.findings if f.kind == "graph-kept-alive")
    assert finding.evidence["holder"] == "teacher.parameters()"
    assert finding.fix.startswith("update `teacher`'s parameters under `with torch.no_grad():`")


@graphwatch.step
def retaining_step(model: nn.Module, opt: torch.optim.Optimizer) -> torch.Tensor:
    opt.zero_grad()
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward(retain_graph=True)  # at: retained
    opt.step()
    return loss


def test_a_step_function_that_retains_its_graph_is_reported(at: Callable[[object, str], str]) -> None:
    torch.manual_seed(0)
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with watch() as gw:
        for _ in range(4):
            loss = retaining_step(model, opt)  # the caller keeps the loss (to log it): its graph stays
            print(f"{loss.item():.3f}")
    assert len(gw.trace.steps) == 4
    finding = next(f for f in gw.findings if f.kind == "retained-graph")
    assert finding.evidence["sites"] == [at(retaining_step, "retained")]


# ------------------------------------------------------- where the walks stop
def test_positions_stop_at_the_frame_the_session_was_entered_in() -> None:
    """The frames above the one a session was entered in are the same for every event while it runs: the
    positions of an event end there, once two user frames were found where a user frame is above it (so
    that an event in the frame entered in keeps its caller, the line's call site)."""
    from graphwatch.capture.steps.loop_steps import LoopSteps

    def event() -> tuple[int, ...]:
        return loop.positions(sys._getframe(0))

    def nested() -> tuple[int, ...]:
        return event()

    def entered_here() -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        unstopped = nested()
        loop.stop_at(sys._getframe(0))
        return unstopped, nested(), event()

    loop = LoopSteps()
    unstopped, stopped, direct = entered_here()
    codes = [id(event.__code__), id(nested.__code__), id(entered_here.__code__)]
    assert stopped[::2] == tuple(codes)  # this test's own frames, above the one entered in, are left out
    assert len(unstopped) > len(stopped) and unstopped[:4] == stopped[:4]
    assert direct[::2] == (codes[0], codes[2])  # two user frames found: it stops there

    def entered_in_middle() -> tuple[int, ...]:
        loop.stop_at(sys._getframe(0))
        return loop.positions(sys._getframe(0))  # an event in the frame entered in

    def outer() -> tuple[int, ...]:
        return entered_in_middle()

    loop = LoopSteps()
    assert outer()[::2][:2] == (id(entered_in_middle.__code__), id(outer.__code__))  # its caller is kept
