"""Saved tensors inside a session are held as torch holds them without one.

torch keeps a saved *input* itself (its Python object lives while the graph
needs it, ``ctx.saved_tensors[0] is x``, attributes included) and keeps only a
copy of a saved *output*, which would otherwise refer back to its own node.
Each test runs the same program bare and inside ``graphwatch.watch()`` and
compares what the user can see: weak references, identities, attributes,
per-tensor hooks, the errors torch raises.
"""

from __future__ import annotations

import gc
import re
import weakref
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
import torch

import graphwatch

pytestmark = pytest.mark.usefixtures("no_session_left")


def bare_and_watched(program: Callable[[], Any]) -> tuple[Any, Any]:
    """``program()`` bare, then inside a session (same seed): both results."""
    torch.manual_seed(0)
    bare = program()
    torch.manual_seed(0)
    with graphwatch.watch(summary=False):
        watched = program()
    return bare, watched


class Double(torch.autograd.Function):
    """Saves its input; reads it (and the user's attribute on it) back in backward."""

    seen: ClassVar[list[Any]] = []

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        Double.seen.append((x, getattr(x, "tag", None)))
        return grad * 2


class Triple(torch.autograd.Function):
    """Saves its input, and nothing else."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * 3

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad * 3 + x * 0


class Exp(torch.autograd.Function):
    """Saves its output."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        y = x.exp()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return grad * y


# --------------------------------------------------------------- lifetimes
def saved_input_lifetime(make: Callable[[torch.Tensor], torch.Tensor], retain: bool) -> list[bool]:
    """Whether the saved input's Python object is alive: after ``del``, after backward, after the graph."""
    a = torch.randn(3, requires_grad=True)
    b = a + 1
    ref = weakref.ref(b)
    c = make(b).sum()
    del b
    alive = [ref() is not None]
    c.backward(retain_graph=retain)
    alive.append(ref() is not None)
    del c
    gc.collect()
    alive.append(ref() is not None)
    return alive


@pytest.mark.parametrize("make", [lambda b: b**2, Triple.apply], ids=["builtin-op", "custom-function"])
@pytest.mark.parametrize("retain", [False, True], ids=["backward", "retain_graph"])
def test_a_saved_inputs_python_object_lives_exactly_as_long_as_without_graphwatch(make, retain):
    bare, watched = bare_and_watched(lambda: saved_input_lifetime(make, retain))
    assert bare == [True, retain, False]
    assert watched == bare


def test_a_saved_output_is_not_kept_alive_by_its_own_graph():
    """torch keeps a copy of a saved output, not the output: its Python object dies with its last name,
    and dropping the graph frees the node (no cycle through C++ that gc cannot see)."""

    def program() -> list[bool]:
        x = torch.randn(3, requires_grad=True)
        y = Exp.apply(x)
        node, out = weakref.ref(y.grad_fn), weakref.ref(y)
        z = y.sum()
        del y
        alive_while_graph = out() is not None
        del z
        return [alive_while_graph, out() is not None, node() is not None]

    bare, watched = bare_and_watched(program)
    assert bare == [False, False, False]
    assert watched == bare


# ------------------------------------------------------------ identities
def test_ctx_saved_tensors_gives_back_the_saved_input_itself_with_its_attributes():
    def program() -> tuple[bool, Any]:
        Double.seen.clear()
        x = torch.randn(3, requires_grad=True) + 0  # a non-leaf input
        x.tag = "mine"
        Double.apply(x).sum().backward()
        (seen, tag), = Double.seen
        return seen is x, tag

    bare, watched = bare_and_watched(program)
    assert bare == (True, "mine")
    assert watched == bare


def test_raw_saved_tensors_show_the_saved_input_and_no_unpack_hook():
    def program() -> list[Any]:
        a = torch.randn(3, requires_grad=True)
        b = a + 1
        y = b.pow(2)
        raw = y.grad_fn._raw_saved_self
        return [raw.data is b, raw.unpack_hook, raw.unpack() is b, torch.equal(y.grad_fn._saved_self, b)]

    bare, watched = bare_and_watched(program)
    assert bare == [True, None, True, True]
    assert watched == bare


class ClearedOnAccess(Double):
    """Double, which lets torch drop its saved input as soon as backward has read it."""

    clear_saved_tensors_on_access = True
    dead_after_del: ClassVar[list[bool]] = []

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        ref = weakref.ref(x)
        del x
        ClearedOnAccess.dead_after_del.append(ref() is None)
        return grad * 2


def test_ctx_saved_tensors_with_clear_on_access_holds_the_input_and_drops_it_after():
    def program() -> tuple[list[bool], torch.Tensor]:
        ClearedOnAccess.dead_after_del.clear()
        x = torch.randn(3, requires_grad=True)
        ClearedOnAccess.apply(x * 1).sum().backward()
        return list(ClearedOnAccess.dead_after_del), x.grad

    (bare_dead, bare_grad), (watched_dead, watched_grad) = bare_and_watched(program)
    assert bare_dead == [True]
    assert watched_dead == bare_dead
    assert torch.equal(watched_grad, bare_grad)


class Product(torch.autograd.Function):
    """x * y with both modes of AD; ``save_for_forward`` keeps what ``jvp`` reads (when ``for_jvp``)."""

    lengths: ClassVar[list[tuple[str, int]]] = []

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor, for_jvp: bool) -> torch.Tensor:
        ctx.save_for_backward(x, y)
        if for_jvp:
            ctx.save_for_forward(x, y)
        return x * y

    @staticmethod
    def jvp(ctx: Any, x_t: torch.Tensor, y_t: torch.Tensor, _: None) -> torch.Tensor:
        saved = ctx.saved_tensors
        Product.lengths.append(("jvp", len(saved)))
        if not saved:
            return x_t
        x, y = saved
        return y * x_t + x * y_t

    @staticmethod
    def vjp(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, y = ctx.saved_tensors
        Product.lengths.append(("vjp", 2))
        return grad * y, grad * x, None


@pytest.mark.parametrize("for_jvp", [True, False], ids=["save_for_forward", "save_for_backward-only"])
def test_ctx_saved_tensors_in_jvp_and_vjp_of_a_function_using_save_for_forward(for_jvp):
    def program() -> tuple[Any, ...]:
        Product.lengths.clear()
        a, b = torch.randn((), requires_grad=True), torch.randn((), requires_grad=True)
        with torch.autograd.forward_ad.dual_level():
            out = Product.apply(torch.autograd.forward_ad.make_dual(a, torch.ones(())), b, for_jvp)
            tangent = torch.autograd.forward_ad.unpack_dual(out).tangent
            out.backward()
        return list(Product.lengths), tangent, a.grad, b.grad

    bare, watched = bare_and_watched(program)
    assert bare[0] == [("jvp", 2 if for_jvp else 0), ("vjp", 2)]
    assert watched[0] == bare[0]
    assert all(torch.equal(w, b) for w, b in zip(watched[1:], bare[1:]))


# ------------------------------------------------------ per-tensor hooks
def test_a_users_per_tensor_saved_hooks_run_inside_a_session():
    def program() -> tuple[list[str], torch.Tensor]:
        calls: list[str] = []
        x = torch.randn(3, requires_grad=True)
        y = x.pow(2)

        def pack(t: torch.Tensor) -> torch.Tensor:
            calls.append("pack")
            return t * 1

        def unpack(t: torch.Tensor) -> torch.Tensor:
            calls.append("unpack")
            return t

        y.grad_fn._raw_saved_self.register_hooks(pack, unpack)
        y.sum().backward()
        return calls, x.grad

    (bare_calls, bare_grad), (watched_calls, watched_grad) = bare_and_watched(program)
    assert bare_calls == ["pack", "unpack"]
    assert watched_calls == bare_calls
    assert torch.equal(watched_grad, bare_grad)


def _register_hooks_error(pack: Callable[[torch.Tensor], Any], twice: bool) -> str:
    y = torch.randn(3, requires_grad=True).pow(2)
    try:
        if twice:
            y.grad_fn._raw_saved_self.register_hooks(lambda t: t, lambda t: t)
        y.grad_fn._raw_saved_self.register_hooks(pack, lambda t: t)
    except RuntimeError as error:
        return str(error)
    return "no error"


@pytest.mark.parametrize(
    ("pack", "twice", "words"),
    [(lambda t: t, True, "already been set"), (lambda t: t.add_(1), False, "modifying its input in place")],
    ids=["registered-twice", "pack-hook-modifies-its-input"],
)
def test_a_refused_per_tensor_hook_raises_torchs_own_error_inside_a_session(pack, twice, words):
    bare, watched = bare_and_watched(lambda: _register_hooks_error(pack, twice))
    assert words in bare
    assert watched == bare


def _wrong_register_hooks_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    y = torch.randn(3, requires_grad=True).pow(2)
    try:
        y.grad_fn._raw_saved_self.register_hooks(*args, **kwargs)
    except TypeError as error:
        return re.sub(r"0x[0-9a-f]+", "0x…", str(error))  # the objects' addresses differ from run to run
    return "no error"


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((lambda t: t,), {}), ((1, 1), {}), ((lambda t: t, lambda t: t, lambda t: t), {}),
     ((), {"pack_hook": lambda t: t, "unpack_hook": lambda t: t})],
    ids=["one-hook", "not-callable", "three-hooks", "by-keyword"],
)  # fmt: skip
def test_a_wrong_call_of_register_hooks_raises_torchs_own_type_error(args, kwargs):
    bare, watched = bare_and_watched(lambda: _wrong_register_hooks_call(args, kwargs))
    assert "incompatible function arguments" in bare
    assert watched == bare


# ------------------------------------------------------------- nested tensors
def test_a_nested_tensor_modified_in_place_raises_torchs_own_message():
    def program() -> str:
        nt = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)], requires_grad=True)
        a = nt * 1
        b = a.sin()  # saves a
        a.mul_(2)
        try:
            torch.nested.to_padded_tensor(b, 0.0).sum().backward()
        except RuntimeError as error:
            return str(error).split("\n")[0]
        return "no error"

    bare, watched = bare_and_watched(program)
    assert "modified by an inplace operation" in bare
    assert watched.startswith(bare.split(" Hint")[0][:80])


def test_a_nested_tensor_trains_inside_a_session_as_without_it():
    def program() -> torch.Tensor:
        nt = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)], requires_grad=True)
        out = torch.nested.to_padded_tensor((nt * 2).sin() * nt, 0.0)
        out.pow(2).sum().backward()
        return torch.nested.to_padded_tensor(nt.grad, 0.0)

    bare, watched = bare_and_watched(program)
    assert torch.equal(watched, bare)


def test_the_saved_tensor_views_are_torchs_own_again_after_the_session():
    saved_tensor = torch._C._autograd.SavedTensor
    names = ("data", "unpack_hook", "unpack", "register_hooks")
    before = {name: saved_tensor.__dict__[name] for name in names}
    saved_tensors = torch.autograd.function.BackwardCFunction.__dict__.get("saved_tensors")
    with pytest.raises(RuntimeError, match="in the session"), graphwatch.watch(summary=False):
        assert all(saved_tensor.__dict__[name] is not before[name] for name in names)
        raise RuntimeError("raised in the session")
    assert {name: saved_tensor.__dict__[name] for name in names} == before
    assert torch.autograd.function.BackwardCFunction.__dict__.get("saved_tensors") is saved_tensors
