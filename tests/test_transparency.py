"""graphwatch changes nothing about the program it watches.

Each training test runs the same seeded code twice, bare and inside
``graphwatch.watch(summary=False)``, and compares every loss, output, gradient
and final parameter with ``torch.equal`` (bit-identical, not "close").
The in-place tests prove DESIGN.md fact 3 (torch's version check, which
saved-tensor hooks switch off, is restored); the lifetime tests prove that no
tensor lives longer under graphwatch (fact 2), with ``gc`` disabled so only
reference counting frees things.
"""

from __future__ import annotations

import gc
import re
import subprocess
import sys
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.checkpoint import checkpoint

import graphwatch

pytestmark = pytest.mark.usefixtures("no_session_left")

STEPS = 3


def _train(
    make_model: Callable[[], nn.Module],
    make_batch: Callable[[], tuple[tuple[torch.Tensor, ...], torch.Tensor]],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    forward: Callable[[nn.Module, tuple[torch.Tensor, ...]], torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """A few SGD-with-momentum steps; every output, loss, gradient, final parameter and buffer."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    seen: dict[str, torch.Tensor] = {}
    for i in range(STEPS):
        opt.zero_grad()
        inputs, target = make_batch()
        out = forward(model, inputs) if forward else model(*inputs)
        loss = loss_fn(out, target)
        loss.backward()
        seen[f"out{i}"] = out.detach().clone()
        seen[f"loss{i}"] = loss.detach().clone()
        for name, p in model.named_parameters():
            assert p.grad is not None, name
            seen[f"grad{i}.{name}"] = p.grad.clone()
        opt.step()
    for name, t in model.state_dict().items():
        seen[f"final.{name}"] = t.clone()
    return seen


# ------------------------------------------------------------------ models
def test_mlp_gradients_bit_identical(bare_and_watched, same_tensors):
    def fn():
        return _train(
            lambda: nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1)),
            lambda: ((torch.randn(32, 8),), torch.randn(32, 1)),
            F.mse_loss,
        )

    bare, watched, gw = bare_and_watched(fn)
    same_tensors(bare, watched)
    assert len(gw.trace.backwards) == STEPS and gw.trace.saved  # graphwatch really watched


def test_cnn_with_batchnorm_and_inplace_relu_gradients_bit_identical(bare_and_watched, same_tensors):
    def fn():
        return _train(
            lambda: nn.Sequential(
                nn.Conv2d(3, 4, 3, padding=1),
                nn.BatchNorm2d(4),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(2),
                nn.Conv2d(4, 4, 3),
                nn.BatchNorm2d(4),
                nn.ReLU(inplace=True),
                nn.Flatten(),
                nn.Linear(4 * 2 * 2, 5),
            ),
            lambda: ((torch.randn(6, 3, 8, 8),), torch.randint(0, 5, (6,))),
            F.cross_entropy,
        )

    bare, watched, gw = bare_and_watched(fn)
    same_tensors(bare, watched)  # includes BatchNorm's running stats (state_dict)
    assert gw.trace.saved


def test_lstm_gradients_bit_identical(bare_and_watched, same_tensors):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(4, 8, num_layers=2, batch_first=True)
            self.head = nn.Linear(8, 1)

        def forward(self, x):
            out, _ = self.lstm(x)
            return self.head(out[:, -1])

    def fn():
        return _train(Net, lambda: ((torch.randn(5, 7, 4),), torch.randn(5, 1)), F.mse_loss)

    bare, watched, gw = bare_and_watched(fn)
    same_tensors(bare, watched)
    assert gw.trace.saved


def test_transformer_encoder_layer_with_seeded_dropout_gradients_bit_identical(bare_and_watched, same_tensors):
    def fn():
        return _train(
            lambda: nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.1, batch_first=True),
            lambda: ((torch.randn(3, 5, 16),), torch.randn(3, 5, 16)),
            F.mse_loss,
        )

    bare, watched, gw = bare_and_watched(fn)
    same_tensors(bare, watched)  # dropout masks equal too: graphwatch draws no random numbers
    assert gw.trace.saved


class _ScaledExp(torch.autograd.Function):
    """exp(x) * w, saving its input, a parameter and its own output."""

    @staticmethod
    def forward(ctx, x, w):
        out = x.exp() * w
        ctx.save_for_backward(x, w, out)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, _w, out = ctx.saved_tensors
        return grad * out, (grad * x.exp()).sum(0)


def test_custom_autograd_function_gradients_bit_identical(bare_and_watched, same_tensors):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.w = nn.Parameter(torch.rand(4))

        def forward(self, x):
            return _ScaledExp.apply(self.lin(x).tanh(), self.w)

    def fn():
        return _train(Net, lambda: ((torch.randn(6, 4),), torch.randn(6, 4)), F.mse_loss)

    bare, watched, gw = bare_and_watched(fn)
    same_tensors(bare, watched)
    assert any(n.op == "_ScaledExpBackward" for n in gw.trace.nodes.values())


def test_non_reentrant_checkpoint_gradients_bit_identical(bare_and_watched, same_tensors):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(6, 12)
            self.block = nn.Sequential(nn.Linear(12, 12), nn.GELU(), nn.Dropout(0.2), nn.Linear(12, 12), nn.Tanh())
            self.out = nn.Linear(12, 1)

        def forward(self, x):
            h = self.inp(x)
            h = checkpoint(self.block, h, use_reentrant=False)  # recomputes, with the same dropout mask
            return self.out(h)

    def fn():
        return _train(Net, lambda: ((torch.randn(8, 6),), torch.randn(8, 1)), F.mse_loss)

    bare, watched, _gw = bare_and_watched(fn)
    same_tensors(bare, watched)


def _mlp_run() -> dict[str, torch.Tensor]:
    return _train(
        lambda: nn.Sequential(nn.Linear(8, 16), nn.Sigmoid(), nn.Linear(16, 1)),
        lambda: ((torch.randn(16, 8),), torch.randn(16, 1)),
        F.mse_loss,
    )


def test_save_on_cpu_entered_inside_the_session_gradients_bit_identical(bare_and_watched, same_tensors):
    def fn():
        with torch.autograd.graph.save_on_cpu():
            return _mlp_run()

    bare, watched, gw = bare_and_watched(fn)
    same_tensors(bare, watched)
    assert len(gw.trace.backwards) == STEPS


def test_save_on_cpu_entered_around_the_session_gradients_bit_identical(same_tensors):
    with torch.autograd.graph.save_on_cpu():
        torch.manual_seed(0)
        bare = _mlp_run()
        outer = torch._C._autograd._top_saved_tensors_default_hooks(False)
        torch.manual_seed(0)
        with graphwatch.watch(summary=False) as gw:
            watched = _mlp_run()
        assert torch._C._autograd._top_saved_tensors_default_hooks(False) == outer  # the user's hooks are back
    same_tensors(bare, watched)
    assert gw.trace.saved  # graphwatch chained save_on_cpu's hooks, so it still saw the saved tensors


def test_double_backward_gradient_penalty_bit_identical(bare_and_watched, same_tensors):
    def fn():
        model = nn.Sequential(nn.Linear(4, 8), nn.Softplus(), nn.Linear(8, 1))
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        seen = {}
        for i in range(STEPS):
            opt.zero_grad()
            x = torch.randn(10, 4, requires_grad=True)
            out = model(x)
            (gx,) = torch.autograd.grad(out.sum(), x, create_graph=True)
            penalty = (gx.norm(dim=1) - 1).pow(2).mean()
            loss = out.pow(2).mean() + 10 * penalty
            loss.backward()
            seen[f"gx{i}"] = gx.detach().clone()
            seen[f"loss{i}"] = loss.detach().clone()
            seen[f"xgrad{i}"] = x.grad.clone()
            for name, p in model.named_parameters():
                seen[f"grad{i}.{name}"] = p.grad.clone()
            opt.step()
        return seen

    bare, watched, gw = bare_and_watched(fn)
    same_tensors(bare, watched)
    assert [b.create_graph for b in gw.trace.backwards[:2]] == [True, False]


def test_autograd_grad_bit_identical(bare_and_watched, same_tensors):
    def fn():
        model = nn.Sequential(nn.Linear(5, 7), nn.ELU(), nn.Linear(7, 2))
        params = list(model.parameters())
        seen = {}
        for i in range(STEPS):
            loss = F.mse_loss(model(torch.randn(9, 5)), torch.randn(9, 2))
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                for p, g in zip(params, grads):
                    p -= 0.1 * g
            seen[f"loss{i}"] = loss.detach().clone()
            seen.update({f"grad{i}.{j}": g for j, g in enumerate(grads)})
            assert all(p.grad is None for p in params)  # autograd.grad accumulates nothing
        return seen

    bare, watched, gw = bare_and_watched(fn)
    same_tensors(bare, watched)
    assert [b.api for b in gw.trace.backwards] == ["grad"] * STEPS


def test_user_tensor_hooks_and_module_hooks_still_fire(bare_and_watched, same_tensors):
    def fn():
        model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 1))
        calls = {"forward": 0, "forward_pre": 0, "full_backward": 0, "tensor": 0}

        def forward_hook(module, args, out):
            calls["forward"] += 1

        def forward_pre_hook(module, args):
            calls["forward_pre"] += 1

        def backward_hook(module, grad_in, grad_out):
            calls["full_backward"] += 1

        model[0].register_forward_hook(forward_hook)
        model[0].register_forward_pre_hook(forward_pre_hook)
        model[2].register_full_backward_hook(backward_hook)
        seen = {}
        for i in range(STEPS):
            h = model[1](model[0](torch.randn(3, 4)))

            def scale(grad):  # a tensor hook that changes the gradient flowing back
                calls["tensor"] += 1
                return grad * 3

            h.register_hook(scale)
            loss = model[2](h).pow(2).sum()
            loss.backward()
            for name, p in model.named_parameters():
                seen[f"grad{i}.{name}"] = p.grad.clone()
                p.grad = None
        seen["calls"] = torch.tensor(list(calls.values()))
        return seen

    bare, watched, _ = bare_and_watched(fn)
    same_tensors(bare, watched)
    assert watched["calls"].tolist() == [STEPS] * 4


def test_torch_func_grad_works_inside_the_session(bare_and_watched, same_tensors):
    def fn():
        w = torch.randn(4)
        x = torch.randn(6, 4)
        return {"g": torch.func.grad(lambda w: (x @ w).tanh().sum())(w)}

    bare, watched, _ = bare_and_watched(fn)
    same_tensors(bare, watched)


def test_torch_func_vmap_gradients_bit_identical(bare_and_watched, same_tensors):
    def fn():
        w = torch.randn(4, 3, requires_grad=True)
        out = torch.func.vmap(lambda x: (x @ w).sin().exp())(torch.randn(5, 4))
        out.sum().backward()
        return {"out": out.detach(), "grad": w.grad}

    bare, watched, gw = bare_and_watched(fn)
    same_tensors(bare, watched)
    assert len(gw.trace.saved) == 3


# Whether torch.func's per-thread state exists, read through the accessor libtorch exports (reading it this way
# creates nothing); then a session at each level trains, and torch.func's own stack read shows the probe sees it.
_FUNCTORCH_STATE = r"""
import ctypes, os, sys, torch
try:
    library = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
    accessor = library._ZN2at9functorch20functorchTLSAccessorEv
except (OSError, AttributeError) as exc:
    sys.exit(f"no probe: {exc}")
accessor.restype = ctypes.c_void_p
created = lambda: ctypes.c_void_p.from_address(accessor()).value is not None
import graphwatch
print(created())
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for level in ("default", "light", "full", "precise"):
    with graphwatch.watch(summary=False, level=level):
        for _ in range(5):
            optimizer.zero_grad()
            model(torch.randn(3, 4)).sum().backward()
            optimizer.step()
print(created())
torch._C._functorch.peek_interpreter_stack()
print(created())
"""


def test_a_session_leaves_torch_funcs_thread_state_uncreated(tmp_path):
    """torch.func's per-thread state, once created, is copied by the engine at every node of every later
    backward of the thread: a session that only trains must not create it (graphwatch looks for a running
    transform only while torch says one is alive)."""
    script = tmp_path / "probe.py"
    script.write_text(_FUNCTORCH_STATE)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    if done.stderr.startswith("no probe: "):  # (a torch build without libtorch_cpu.so or that symbol)
        pytest.skip(done.stderr.strip())
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "True"]


def test_torch_compile_first_compiled_inside_the_session_gradients_bit_identical(same_tensors):
    def run() -> dict[str, torch.Tensor]:
        torch._dynamo.reset()  # so the compilation happens in this run (inside the session when watched)
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
        compiled = torch.compile(model, backend="aot_eager")
        seen = {}
        for i in range(2):
            loss = compiled(torch.randn(4, 6)).pow(2).mean()
            loss.backward()
            seen[f"loss{i}"] = loss.detach()
            seen.update({f"grad{i}.{n}": p.grad.clone() for n, p in model.named_parameters()})
        return seen

    bare = run()
    with graphwatch.watch(summary=False) as gw:
        watched = run()
    torch._dynamo.reset()
    same_tensors(bare, watched)
    assert len(gw.trace.backwards) == 2


# -------------------------------------------------------------- in-place
def _error_or_grad(fn: Callable[[], torch.Tensor], watched: bool) -> tuple[str, object]:
    torch.manual_seed(0)
    try:
        if watched:
            with graphwatch.watch(summary=False):
                return "ok", fn()
        return "ok", fn()
    except RuntimeError as exc:
        return "raised", exc


def _versions(message: str) -> tuple[str, str]:
    found = re.search(r"is at version (\d+); expected version (\d+) instead", message)
    assert found, message
    return found.groups()


def test_inplace_change_to_saved_output_raises_torchs_error_with_and_without_graphwatch():
    def fn():
        x = torch.ones(3, requires_grad=True)
        y = x.exp()  # exp saves its output
        y.add_(1)
        y.sum().backward()
        return x.grad

    bare = _error_or_grad(fn, watched=False)
    watched = _error_or_grad(fn, watched=True)
    assert bare[0] == watched[0] == "raised"
    assert type(bare[1]) is type(watched[1]) is RuntimeError
    for _, exc in (bare, watched):
        assert "one of the variables needed for gradient computation has been modified by an inplace operation" in str(exc)
    assert _versions(str(watched[1])) == _versions(str(bare[1])) == ("1", "0")


def test_inplace_change_to_saved_input_through_a_view_raises_with_and_without_graphwatch():
    def fn():
        x = torch.ones(4, requires_grad=True)
        a = x * 1
        y = a.pow(2)  # pow saves its input a
        a[1:3].mul_(5)  # changes a through a view
        y.sum().backward()
        return x.grad

    bare = _error_or_grad(fn, watched=False)
    watched = _error_or_grad(fn, watched=True)
    assert bare[0] == watched[0] == "raised"
    assert "modified by an inplace operation" in str(watched[1])
    assert _versions(str(watched[1])) == _versions(str(bare[1]))


@pytest.mark.parametrize(
    "case",
    ["inplace_on_unsaved", "inplace_op_saves_its_result", "relu_inplace_after_linear", "batchnorm_two_forwards", "clone_then_inplace"],
)
def test_inplace_code_that_is_fine_without_graphwatch_stays_fine_with_it(case, same_tensors):
    def inplace_on_unsaved():
        x = torch.randn(3, requires_grad=True)
        y = x * 2  # mul by a number saves no tensor
        y.add_(1)
        y.sum().backward()
        return x.grad

    def inplace_op_saves_its_result():
        x = torch.randn(3, requires_grad=True)
        y = x.clone()
        y.sigmoid_()  # saves its (in-place) result after bumping the version
        y.sum().backward()
        return x.grad

    def relu_inplace_after_linear():
        lin = nn.Linear(4, 4)
        y = F.relu(lin(torch.randn(2, 4)), inplace=True)
        (y * y).sum().backward()
        return lin.weight.grad

    def batchnorm_two_forwards():  # running stats change between the forwards, as in a GAN discriminator
        m = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
        a, b = m(torch.randn(8, 4)), m(torch.randn(8, 4))
        (a.sum() + b.pow(2).sum()).backward()
        return m[0].weight.grad

    def clone_then_inplace():
        x = torch.randn(3, requires_grad=True)
        y = x.tanh()
        z = y.clone()
        z.add_(1)  # changes the clone, not the saved y
        (y.sum() + z.sum()).backward()
        return x.grad

    fn = locals()[case]
    bare = _error_or_grad(fn, watched=False)
    watched = _error_or_grad(fn, watched=True)
    assert bare[0] == "ok", bare[1]
    assert watched[0] == "ok", watched[1]
    same_tensors({"grad": bare[1]}, {"grad": watched[1]})


# -------------------------------------------------------------- lifetimes
@contextmanager
def _refcounting_only() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class _Watch:
    """Weak references to a tensor object and to its storage (the memory)."""

    def __init__(self, t: torch.Tensor) -> None:
        self.obj = weakref.ref(t)
        self.mem = StorageWeakRef(t.untyped_storage())

    @property
    def dead(self) -> bool:
        return self.obj() is None and self.mem.expired()

    @property
    def memory_freed(self) -> bool:
        return self.mem.expired()


def _lifetimes(scenario: Callable[[list], None]) -> tuple[list, list]:
    """Run ``scenario(log)`` bare and under graphwatch with gc off; both logs of (label, freed)."""
    bare: list = []
    watched: list = []
    with _refcounting_only():
        torch.manual_seed(0)
        scenario(bare)
        torch.manual_seed(0)
        with graphwatch.watch(summary=False):
            scenario(watched)
    return bare, watched


def test_saved_output_is_freed_when_the_graph_is_dropped_as_without_graphwatch():
    """DESIGN fact 2: a pack hook returning the tensor itself leaks a saved output forever."""

    def scenario(log):
        x = torch.ones(1000, requires_grad=True)
        y = x.exp()  # saves its output y
        w = _Watch(y)
        loss = y.sum()
        del y
        log.append(("graph alive", w.memory_freed))
        del loss
        log.append(("graph dropped", w.dead))

    bare, watched = _lifetimes(scenario)
    assert bare == [("graph alive", False), ("graph dropped", True)]
    assert watched == bare


def test_saved_tensors_are_freed_by_backward_as_without_graphwatch():
    def scenario(log):
        x = torch.ones(1000, requires_grad=True)
        inp = torch.randn(1000)
        h = x * inp  # saves inp and x
        y = h.exp()  # saves y
        w_inp, w_y = _Watch(inp), _Watch(y)
        loss = y.sum()
        del inp, h, y
        log.append(("before backward", w_inp.memory_freed, w_y.memory_freed))
        loss.backward()
        log.append(("after backward", w_inp.dead, w_y.dead))  # loss (the graph's root) is still referenced

    bare, watched = _lifetimes(scenario)
    assert bare == [("before backward", False, False), ("after backward", True, True)]
    assert watched == bare


def test_retained_graph_is_freed_when_dropped_as_without_graphwatch():
    def scenario(log):
        x = torch.ones(1000, requires_grad=True)
        y = x.sigmoid()
        w = _Watch(y)
        loss = y.sum()
        del y
        loss.backward(retain_graph=True)
        log.append(("retained", w.memory_freed))
        loss.backward(retain_graph=True)
        log.append(("retained twice", w.memory_freed))
        del loss
        log.append(("dropped", w.dead))

    bare, watched = _lifetimes(scenario)
    assert bare == [("retained", False), ("retained twice", False), ("dropped", True)]
    assert watched == bare


def test_graph_never_backwarded_is_freed_when_dropped_as_without_graphwatch():
    def scenario(log):
        lin = nn.Linear(50, 50)
        h = lin(torch.randn(4, 50)).tanh()
        w = _Watch(h)
        out = h * 2
        del h
        log.append(("graph alive", w.memory_freed))
        del out
        log.append(("dropped", w.dead))

    bare, watched = _lifetimes(scenario)
    assert bare == [("graph alive", False), ("dropped", True)]
    assert watched == bare


def test_activations_of_training_steps_die_with_their_step_as_without_graphwatch():
    def scenario(log):
        model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(3):
            opt.zero_grad()
            hidden = model[1](model[0](torch.randn(16, 8)))
            w = _Watch(hidden)
            loss = model[2](hidden).pow(2).mean()
            del hidden
            log.append((i, "forward", w.memory_freed))
            loss.backward()
            opt.step()
            log.append((i, "stepped", w.memory_freed))
            del loss
            log.append((i, "dropped", w.dead))

    bare, watched = _lifetimes(scenario)
    # ReLU saves its output (hidden): the backward frees it, and the tensor object dies with loss's graph
    assert bare == [(i, *rest) for i in range(3) for rest in (("forward", False), ("stepped", True), ("dropped", True))]
    assert watched == bare


def test_double_backward_graph_is_freed_when_dropped_as_without_graphwatch():
    def scenario(log):
        x = torch.randn(100, requires_grad=True)
        y = x.exp()
        w = _Watch(y)
        (gx,) = torch.autograd.grad(y.sum(), x, create_graph=True)
        w_gx = _Watch(gx)
        penalty = gx.pow(2).sum()
        del y
        log.append(("graphs alive", w.memory_freed, w_gx.memory_freed))
        penalty.backward()
        del gx, penalty
        log.append(("dropped", w.dead, w_gx.dead))

    bare, watched = _lifetimes(scenario)
    assert bare == [("graphs alive", False, False), ("dropped", True, True)]
    assert watched == bare


def test_save_on_cpu_around_the_session_keeps_memory_behaviour_unchanged():
    """On CPU, torch's own save_on_cpu keeps a saved output alive (fact 2 bites it); graphwatch adds nothing."""

    def scenario(log):
        x = torch.ones(1000, requires_grad=True)
        y = x.sin()  # saves its input x only
        z = y.exp()  # saves its output
        w_y, w_z = _Watch(y), _Watch(z)
        loss = z.sum()
        del y, z
        loss.backward()
        del loss
        log.append(("dropped", w_y.dead, w_z.memory_freed))

    with torch.autograd.graph.save_on_cpu():
        bare, watched = _lifetimes(scenario)
    assert bare[0][:2] == ("dropped", True)
    assert watched == bare


def test_session_keeps_no_tensor_after_exit():
    with _refcounting_only():
        with graphwatch.watch(summary=False) as gw:
            x = torch.ones(100, requires_grad=True)
            y = x.exp()
            w = _Watch(y)
            loss = y.sum()
            loss.backward(retain_graph=True)  # graph alive at session exit
            del y
        assert not w.memory_freed
        del loss
        assert w.dead
        assert gw.trace.saved  # the trace outlives the tensors it describes
