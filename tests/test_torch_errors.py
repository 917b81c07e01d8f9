"""torch's own error messages come first and unchanged inside a session; graphwatch only adds to them.

Each program raises an autograd error bare; inside ``graphwatch.watch()`` the
same error type (or a subclass) must carry torch's whole message, then a
blank line, then graphwatch's paragraphs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import graphwatch

pytestmark = pytest.mark.usefixtures("no_session_left")


def error_text(program: Callable[[], Any]) -> str:
    with pytest.raises(RuntimeError) as raised:
        program()
    return str(raised.value)


def bare_and_watched_errors(program: Callable[[], Any]) -> tuple[str, str]:
    bare = error_text(program)
    with graphwatch.watch(summary=False, snapshots="off"):
        watched = error_text(program)
    return bare, watched


class Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        ctx.saved_tensors  # noqa: B018  (unpacks: the version check)
        return grad * 2


def output_changed() -> None:
    y = torch.randn(3, requires_grad=True).exp()
    y.add_(1)
    y.sum().backward()


def input_changed() -> None:
    b = torch.randn(3, requires_grad=True) + 1
    y = b.sin()
    b.mul_(2)
    y.sum().backward()


def leaf_changed() -> None:
    w = torch.randn(3, requires_grad=True)
    y = (w * torch.randn(3, requires_grad=True)).sum()
    with torch.no_grad():
        w.add_(1)
    y.backward()


def leaf_given_a_history_by_copy() -> None:
    x, source = torch.randn(3), torch.randn(3, requires_grad=True)
    y = (x * source).sum()  # saves x, a leaf that needs no grad
    x.copy_(source * 2)  # x now has a grad_fn (CopyBackwards): torch names it
    y.backward()


def clamp_output_changed() -> None:
    y = torch.randn(3, requires_grad=True).clamp(min=-0.5)
    z = y.abs()
    y.clamp_(max=0.5)
    z.sum().backward()


def custom_function_input_changed() -> None:
    b = torch.randn(3, requires_grad=True) + 1
    y = Double.apply(b)
    b.mul_(2)
    y.sum().backward()


def changed_under_anomaly_detection() -> None:
    with torch.autograd.detect_anomaly(check_nan=False):
        output_changed()


def backward_twice() -> None:
    y = torch.randn(3, requires_grad=True).exp().sum()
    y.backward()
    y.backward()


def loss_under_no_grad() -> None:
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        loss = model(torch.randn(4, 3)).pow(2).mean()
        loss.backward()


@torch.jit.script
def forked_exp(x: torch.Tensor) -> torch.Tensor:
    future = torch.jit._fork(torch.exp, x)
    return torch.jit._wait(future) * x


def backward_twice_through_a_torchscript_fork() -> None:
    y = forked_exp(torch.ones(2, 2, requires_grad=True)).sum()  # the fork saves on a thread of TorchScript's
    y.backward()
    y.backward()


PROGRAMS = [
    output_changed,
    input_changed,
    leaf_changed,
    leaf_given_a_history_by_copy,
    clamp_output_changed,
    custom_function_input_changed,
    changed_under_anomaly_detection,
    backward_twice,
    backward_twice_through_a_torchscript_fork,
    loss_under_no_grad,
]


@pytest.mark.filterwarnings("ignore:Anomaly Detection has been enabled")
@pytest.mark.filterwarnings("ignore:Error detected in")
@pytest.mark.parametrize("program", PROGRAMS, ids=[p.__name__ for p in PROGRAMS])
def test_torchs_message_comes_first_and_unchanged(program):
    bare, watched = bare_and_watched_errors(program)
    assert watched.startswith(bare + "\n\ngraphwatch"), f"\nbare:    {bare!r}\nwatched: {watched!r}"


def test_a_torchscript_fork_runs_forward_inside_a_session():
    """The fork's ops save tensors on a thread with no Python frames above the pack hook."""
    x = torch.ones(2, 2, requires_grad=True)
    bare = torch.autograd.grad(forked_exp(x).sum(), x)[0]
    with graphwatch.watch(summary=False):
        watched = torch.autograd.grad(forked_exp(x).sum(), x)[0]
    assert torch.equal(watched, bare)
