"""A session's life: what it installs, what it leaves behind, how it counts steps.

On every exit (normal, exception, KeyboardInterrupt) nothing of graphwatch's
stays: saved-tensor hooks, the engine entry-point wrappers, the global
optimizer hooks, ``nn.Module.eval`` and the active-session slot are all back
to what they were.
"""

from __future__ import annotations

import threading

import pytest
import torch
import torch.autograd
import torch.autograd.graph
import torch.nn as nn
import torch.optim.optimizer as optimizer_module

import graphwatch

pytestmark = pytest.mark.usefixtures("no_session_left")

# torch's own entry points, taken when this module is imported (before any session)
_ENGINE_GRAPH = torch.autograd.graph._engine_run_backward
_ENGINE_AUTOGRAD = torch.autograd._engine_run_backward


def _global_state() -> dict:
    """Everything a session may touch, as comparable values."""
    return {
        "saved_tensors_hooks": torch._C._autograd._top_saved_tensors_default_hooks(False),
        "engine (torch.autograd.graph)": torch.autograd.graph._engine_run_backward,
        "engine (torch.autograd)": torch.autograd._engine_run_backward,
        "optimizer pre hooks": dict(optimizer_module._global_optimizer_pre_hooks),
        "optimizer post hooks": dict(optimizer_module._global_optimizer_post_hooks),
        "active session": graphwatch.active_session(),
        "disable_saved_tensors_hooks": torch.autograd.graph.disable_saved_tensors_hooks,
        "Module.eval": nn.Module.eval,
    }


def _train_a_bit(steps: int = 2) -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(4, 3)).exp().mean().backward()
        opt.step()


def _assert_installed_while_active(gw: graphwatch.Session, before: dict) -> None:
    """Sanity: the comparison below is not vacuous, the session did install its hooks."""
    now = _global_state()
    assert now["active session"] is gw
    assert now["saved_tensors_hooks"] is not None
    assert now["engine (torch.autograd.graph)"] is not before["engine (torch.autograd.graph)"]
    assert now["engine (torch.autograd)"] is not before["engine (torch.autograd)"]
    assert len(now["optimizer pre hooks"]) == len(before["optimizer pre hooks"]) + 1
    assert len(now["optimizer post hooks"]) == len(before["optimizer post hooks"]) + 1
    assert now["Module.eval"] is not before["Module.eval"]  # (the default level watches validation passes)


def _assert_clean(before: dict) -> None:
    after = _global_state()
    assert after["saved_tensors_hooks"] == before["saved_tensors_hooks"]  # None, or the user's own hooks
    assert after["engine (torch.autograd.graph)"] is _ENGINE_GRAPH
    assert after["engine (torch.autograd)"] is _ENGINE_AUTOGRAD
    assert after == before
    assert graphwatch.active_session() is None


# ------------------------------------------------------------------ exits
def test_normal_exit_leaves_nothing_behind():
    before = _global_state()
    assert before["saved_tensors_hooks"] is None and before["active session"] is None
    with graphwatch.watch(summary=False) as gw:
        _assert_installed_while_active(gw, before)
        _train_a_bit()
    _assert_clean(before)
    assert gw.trace.ended_early is None
    assert not gw.active


def test_exception_exit_leaves_nothing_behind_and_propagates_the_same_exception():
    before = _global_state()
    error = ValueError("the user's own error")
    with pytest.raises(ValueError) as raised:
        with graphwatch.watch(summary=False) as gw:
            _assert_installed_while_active(gw, before)
            _train_a_bit()
            raise error
    assert raised.value is error
    assert str(raised.value) == "the user's own error"
    _assert_clean(before)
    assert gw.trace.ended_early == "ValueError: the user's own error"


def test_keyboard_interrupt_exit_leaves_nothing_behind():
    before = _global_state()
    with pytest.raises(KeyboardInterrupt):
        with graphwatch.watch(summary=False) as gw:
            _assert_installed_while_active(gw, before)
            _train_a_bit()
            raise KeyboardInterrupt
    _assert_clean(before)
    assert gw.trace.ended_early == "KeyboardInterrupt"


def test_exception_in_the_middle_of_a_backward_leaves_nothing_behind():
    before = _global_state()
    x = torch.ones(3, requires_grad=True)

    def fail(grad):
        raise ArithmeticError("raised by a tensor hook during backward")

    with pytest.raises(ArithmeticError, match="raised by a tensor hook"):
        with graphwatch.watch(summary=False) as gw:
            y = x.exp()
            y.register_hook(fail)
            y.sum().backward()
    _assert_clean(before)
    assert gw.trace.ended_early == "ArithmeticError: raised by a tensor hook during backward"


def test_user_exception_propagates_unchanged_from_a_strict_session_with_a_leak():
    w = torch.randn(4, 4, requires_grad=True)
    error = ValueError("the user's own error")
    with pytest.raises(ValueError) as raised:
        with graphwatch.watch(summary=False, strict=True) as gw:
            total = 0
            for i in range(2):
                loss = (w @ torch.randn(4)).tanh().sum()
                total = total + loss  # keeps every step's graph alive: a leak
                loss.backward()
                if i == 1:
                    raise error
    assert raised.value is error
    assert gw.trace.ended_early == "ValueError: the user's own error"
    assert graphwatch.active_session() is None


def test_user_hooks_entered_outside_the_session_are_back_on_exit():
    pack, unpack = (lambda t: t.detach()), (lambda t: t)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        before = _global_state()
        assert before["saved_tensors_hooks"] == (pack, unpack)
        with graphwatch.watch(summary=False) as gw:
            assert _global_state()["saved_tensors_hooks"] != (pack, unpack)  # graphwatch's chain is on top
            _train_a_bit()
        _assert_clean(before)
        with pytest.raises(RuntimeError, match="boom"):
            with graphwatch.watch(summary=False):
                raise RuntimeError("boom")
        _assert_clean(before)
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    assert gw.trace.saved


# ---------------------------------------------------------------- nesting
def test_nested_watch_raises_usage_error_naming_the_fix_and_outer_session_keeps_working():
    before = _global_state()
    x = torch.ones(3, requires_grad=True)
    with graphwatch.watch(summary=False) as outer:
        x.exp().sum().backward()
        inside = _global_state()
        with pytest.raises(graphwatch.UsageError) as raised:
            with graphwatch.watch(summary=False):
                pytest.fail("the nested session must not be entered")
        message = str(raised.value)
        assert "already active" in message
        assert "gw.step()" in message and "exit it before entering another" in message
        assert _global_state() == inside  # the failed inner session changed nothing
        assert graphwatch.active_session() is outer
        x.sin().sum().backward()  # the outer session still records
    _assert_clean(before)
    assert len(outer.trace.backwards) == 2
    assert {outer.trace.nodes[r].op for b in outer.trace.backwards for r in b.roots} == {"SumBackward0"}
    # exp's output, then sin's x, each 12 bytes: the outer session's hooks saw both (one step: no loop here)
    assert [(s.saved_packed, s.saved_bytes_packed) for s in outer.trace.steps] == [(2, 24)]


def test_reentering_the_same_session_raises_usage_error():
    with graphwatch.watch(summary=False) as gw:
        with pytest.raises(graphwatch.UsageError, match="already active"):
            with gw:
                pass
        assert graphwatch.active_session() is gw
    assert graphwatch.active_session() is None


# ---------------------------------------------------------------- threads
def _thread_training(gen_seed: int, steps: int, results: dict, start: threading.Event | None = None) -> None:
    """Train with a private generator so another thread's random draws cannot interfere."""
    try:
        if start is not None:
            assert start.wait(30), "the main thread never entered its session"
        gen = torch.Generator().manual_seed(gen_seed)
        w1 = torch.randn(6, 12, generator=gen).requires_grad_()
        w2 = torch.randn(12, 1, generator=gen).requires_grad_()
        opt = torch.optim.SGD([w1, w2], lr=0.01)
        for i in range(steps):
            opt.zero_grad()
            x = torch.randn(16, 6, generator=gen)
            loss = (x @ w1).tanh().matmul(w2).pow(2).mean()
            loss.backward()
            results[f"loss{i}"] = loss.detach().clone()
            results[f"w1.grad{i}"] = w1.grad.clone()
            results[f"w2.grad{i}"] = w2.grad.clone()
            opt.step()
    except BaseException as exc:  # reported by the main thread
        results["error"] = exc


def test_session_in_main_thread_ignores_another_threads_training_and_leaves_it_unchanged(same_tensors):
    """Documented behaviour: a session watches the thread that entered it.

    Saved-tensor hooks are thread-local, and the engine wrapper and the
    optimizer hooks pass other threads' calls straight through: another
    thread's backwards and optimizer steps are not recorded, and its results
    are bit-identical to a run without graphwatch.
    """
    reference: dict = {}
    alone = threading.Thread(target=_thread_training, args=(7, 5, reference))
    alone.start()
    alone.join(60)
    assert "error" not in reference

    results: dict = {}
    start = threading.Event()
    other = threading.Thread(target=_thread_training, args=(7, 5, results, start))
    other.start()
    before = _global_state()
    main_backwards = 0
    with graphwatch.watch(summary=False) as gw:
        start.set()
        model = nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        while other.is_alive() or main_backwards < 3:  # train in the main thread while the other one trains
            opt.zero_grad()
            model(torch.randn(4, 3)).exp().mean().backward()
            opt.step()
            main_backwards += 1
            other.join(0.001)
    other.join(60)
    assert not other.is_alive()
    _assert_clean(before)
    assert "error" not in results, results.get("error")
    same_tensors(reference, results)
    # only the main thread's work was recorded
    assert len(gw.trace.backwards) == main_backwards
    assert [s.source for s in gw.trace.steps] == ["optimizer"] * main_backwards
    assert all(s.optimizer_steps == 1 for s in gw.trace.steps)
    assert {gw.trace.sites[b.site].function for b in gw.trace.backwards} == {
        "test_session_in_main_thread_ignores_another_threads_training_and_leaves_it_unchanged"
    }
    assert {gw.trace.sites[s.site].function for s in gw.trace.saved.values()} <= {
        "test_session_in_main_thread_ignores_another_threads_training_and_leaves_it_unchanged"
    }


# ------------------------------------------------------------------ steps
def _model_and_opt():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _loss(model):
    return model(torch.randn(8, 4)).pow(2).mean()


def test_step_decorator_inside_a_session_makes_one_step_per_call():
    model, opt = _model_and_opt()

    @graphwatch.step
    def train_step(batch):
        opt.zero_grad()
        loss = model(batch).pow(2).mean()
        loss.backward()
        opt.step()
        return loss.item()

    with graphwatch.watch(summary=False) as gw:
        for _ in range(4):
            train_step(torch.randn(8, 4))
    assert [s.source for s in gw.trace.steps] == ["explicit"] * 4
    assert [s.backwards for s in gw.trace.steps] == [[0], [1], [2], [3]]
    assert [s.optimizer_steps for s in gw.trace.steps] == [1] * 4


def test_explicit_steps_are_the_only_boundaries_once_used():
    model, opt = _model_and_opt()
    with graphwatch.watch(summary=False) as gw:
        for _ in range(3):
            with gw.step():
                for _ in range(2):  # two optimizer steps and two freeing backwards per explicit step
                    opt.zero_grad()
                    _loss(model).backward()
                    opt.step()
    assert [s.source for s in gw.trace.steps] == ["explicit"] * 3
    assert [s.optimizer_steps for s in gw.trace.steps] == [2, 2, 2]
    assert [s.backwards for s in gw.trace.steps] == [[0, 1], [2, 3], [4, 5]]
    assert [b.step for b in gw.trace.backwards] == [0, 0, 1, 1, 2, 2]


def test_work_before_the_first_explicit_step_is_closed_as_its_own_step():
    model, _opt = _model_and_opt()
    with graphwatch.watch(summary=False) as gw:
        _loss(model).backward()
        _loss(model).backward()
        for _ in range(2):
            with gw.step():
                _loss(model).backward()
    assert [s.source for s in gw.trace.steps] == ["backward", "explicit", "explicit"]
    assert [s.backwards for s in gw.trace.steps] == [[0, 1], [2], [3]]


def test_optimizer_steps_end_steps_without_explicit_markers():
    model, opt = _model_and_opt()
    with graphwatch.watch(summary=False) as gw:
        for _ in range(3):
            opt.zero_grad()
            _loss(model).backward()
            opt.step()
    assert [s.source for s in gw.trace.steps] == ["optimizer"] * 3
    assert [s.backwards for s in gw.trace.steps] == [[0], [1], [2]]
    assert [s.optimizer_steps for s in gw.trace.steps] == [1, 1, 1]


def test_gradient_accumulation_micro_batches_are_one_step_with_their_optimizer_step():
    """Documented rule: a step ends after the loop's last training event, here the optimizer step."""
    model, opt = _model_and_opt()
    with graphwatch.watch(summary=False) as gw:
        for _ in range(3):
            opt.zero_grad()
            for _ in range(2):
                _loss(model).backward()
            opt.step()
    assert [s.source for s in gw.trace.steps] == ["optimizer", "optimizer", "optimizer"]
    assert [s.backwards for s in gw.trace.steps] == [[0, 1], [2, 3], [4, 5]]


def test_freeing_backwards_end_steps_without_optimizer_or_explicit_markers():
    model, _ = _model_and_opt()
    with graphwatch.watch(summary=False) as gw:
        for _ in range(3):
            _loss(model).backward()
        for _ in range(2):
            torch.autograd.grad(_loss(model), list(model.parameters()))  # frees its graph too
    assert [s.source for s in gw.trace.steps] == ["backward"] * 5
    assert [s.backwards for s in gw.trace.steps] == [[0], [1], [2], [3], [4]]


def test_a_loop_step_ends_after_its_last_backward_retained_or_not():
    model, _ = _model_and_opt()
    with graphwatch.watch(summary=False) as gw:
        for _ in range(3):
            loss = _loss(model)
            loss.backward(retain_graph=True)  # keeps the graph: not a step end ...
            loss.backward()  # ... this one frees it
    assert [s.source for s in gw.trace.steps] == ["backward"] * 3
    assert [s.backwards for s in gw.trace.steps] == [[0, 1], [2, 3], [4, 5]]

    with graphwatch.watch(summary=False) as gw:  # a loop's last backward ends its step, retained or not
        for _ in range(3):
            _loss(model).backward(retain_graph=True)
    assert [s.backwards for s in gw.trace.steps] == [[0], [1], [2]]


def test_freeing_backwards_end_steps_when_the_forward_saves_no_tensor():
    w = torch.ones(3, requires_grad=True)
    with graphwatch.watch(summary=False) as gw:
        for _ in range(3):
            (w * 2).sum().backward()  # mul by a number and sum save no tensor
    assert [s.source for s in gw.trace.steps] == ["backward"] * 3
    assert [s.backwards for s in gw.trace.steps] == [[0], [1], [2]]


def test_freeing_backwards_end_steps_at_the_light_level():
    model, _ = _model_and_opt()
    with graphwatch.watch(summary=False, level="light") as gw:
        for _ in range(3):
            _loss(model).backward()
    assert [s.source for s in gw.trace.steps] == ["backward"] * 3
    assert [s.backwards for s in gw.trace.steps] == [[0], [1], [2]]


def test_optimizer_steps_end_steps_at_the_light_level():
    model, opt = _model_and_opt()
    with graphwatch.watch(summary=False, level="light") as gw:
        for _ in range(3):
            opt.zero_grad()
            _loss(model).backward()
            opt.step()
    assert [s.source for s in gw.trace.steps] == ["optimizer"] * 3
    assert [s.backwards for s in gw.trace.steps] == [[0], [1], [2]]
    assert not gw.trace.saved  # the light level records no saved tensors


def test_session_without_backward_is_one_session_end_step():
    model, _ = _model_and_opt()
    with graphwatch.watch(summary=False) as gw:
        _loss(model)
    assert [s.source for s in gw.trace.steps] == ["session-end"]
    assert gw.trace.steps[0].backwards == []

    with graphwatch.watch(summary=False) as gw:
        pass
    assert [s.source for s in gw.trace.steps] == ["session-end"]


def test_step_outside_an_active_session_raises_and_active_session_is_none():
    with graphwatch.watch(summary=False) as gw:
        assert graphwatch.active_session() is gw and gw.active
    assert graphwatch.active_session() is None and not gw.active
    with pytest.raises(graphwatch.UsageError, match="needs an active session"):
        with gw.step():
            pass
