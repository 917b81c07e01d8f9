"""Differential fuzzing: random autograd programs behave the same with and without graphwatch.

Hypothesis generates small training programs: a few steps, each a random
list of instructions over a pool of 4x4 tensors — elementwise unary and
binary ops, matmul, conv1d/conv2d (with parameter and with computed
weights), reductions, views (reshape, transpose, expand, as_strided),
indexing (index, gather, index_put, masked_fill), two custom
``autograd.Function`` s, non-reentrant checkpoint, in-place ops (on fresh and
on saved tensors, through views, under ``no_grad`` on leaves), detach
patterns, and backward calls (``.backward`` with and without
``retain_graph``, ``autograd.grad`` with ``create_graph`` for double
backward, a repeat of the previous backward, roots carried into the next
step).  Many programs raise torch's "backward through the graph a second
time" or "modified by an inplace operation" errors; the interpreter logs
every error and carries on.

Each program runs bare, then inside ``graphwatch.watch(summary=False, ...)``
(``snapshots="off"`` mostly, drawn snapshots sometimes; random
``keep_steps``; explicit ``gw.step()`` blocks sometimes) and the two runs
must agree:

* every forward value and every gradient bit for bit (NaN payloads too);
* every exception: the same type or a subclass (graphwatch raises
  ``BackwardTwiceError``, a ``RuntimeError``) and torch's message unchanged,
  first: graphwatch may only add paragraphs after it;
* the same warnings;
* lifetimes: with ``gc`` disabled, at every step end each tensor of the
  program (its Python object, and its storage) is alive under graphwatch
  exactly when it is alive without it (saved inputs' objects die neither
  later nor earlier); after the run and a ``gc.collect()`` none is alive that
  is dead bare, checked inside the session and again after it exits.

CI runs a fixed set (``derandomize=True``).  For a longer local run::

    GRAPHWATCH_FUZZ_EXAMPLES=3000 python -m pytest tests/test_fuzz_transparency.py -q -s

``GRAPHWATCH_FUZZ_EXAMPLES`` is the number of programs at the default level
(the light and precise levels get a quarter each); ``-s`` shows the counts
of programs, instructions, backwards and errors each test generated.
"""

from __future__ import annotations

import contextlib
import gc
import os
import warnings
import weakref
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, Phase, example, given, seed, settings
from hypothesis import strategies as st
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.checkpoint import checkpoint

import graphwatch

pytestmark = pytest.mark.usefixtures("no_session_left")

EXAMPLES = int(os.environ.get("GRAPHWATCH_FUZZ_EXAMPLES", "120"))
SIDE_EXAMPLES = max(10, EXAMPLES // 4)  # the light and the precise level each

INPLACE_PHRASE = "one of the variables needed for gradient computation has been modified by an inplace operation: "

PERM = torch.tensor([2, 0, 3, 1])
ROWS = torch.tensor([0, 2])
GATHER = torch.tensor([[0, 0, 1, 3], [3, 2, 2, 0], [1, 1, 1, 1], [0, 3, 2, 1]])
MASK = torch.tensor([[True, False, False, True], [False, False, True, False]] * 2)


# ------------------------------------------------------------ custom Functions
class Cube(torch.autograd.Function):
    """x**3, saving its input."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 3 * grad * x * x


class MulExp(torch.autograd.Function):
    """x * exp(clamp(y)), saving both inputs and its own output."""

    @staticmethod
    def forward(ctx, x, y):
        out = x * y.clamp(-4, 4).exp()
        ctx.save_for_backward(x, y, out)
        return out

    @staticmethod
    def backward(ctx, grad):
        _, y, out = ctx.saved_tensors
        inside = (y.abs() <= 4).to(grad.dtype)
        return grad * y.clamp(-4, 4).exp(), grad * out * inside


def _sin_cos(t: torch.Tensor) -> torch.Tensor:
    return t.sin() * t.cos()


# ------------------------------------------------------------------- the ops
# Each takes (run, x, y) with x, y from the pool and returns a new tensor (4x4, mostly).
OPS: dict[str, Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    # elementwise unary
    "exp": lambda r, x, y: x.clamp(-4, 4).exp(),
    "tanh": lambda r, x, y: x.tanh(),
    "sigmoid": lambda r, x, y: x.sigmoid(),
    "sin": lambda r, x, y: x.sin(),
    "relu": lambda r, x, y: F.relu(x),
    "abs": lambda r, x, y: x.abs(),
    "square": lambda r, x, y: x * x,  # one tensor saved twice: one storage
    "pow3": lambda r, x, y: x.pow(3),
    "neg": lambda r, x, y: -x,  # saves nothing
    "scale": lambda r, x, y: x * 3,  # saves nothing
    "log": lambda r, x, y: (x.abs() + 1).log(),
    "sqrt": lambda r, x, y: (x * x + 1).sqrt(),
    "softplus": lambda r, x, y: F.softplus(x),
    "gelu": lambda r, x, y: F.gelu(x),
    "leaky": lambda r, x, y: F.leaky_relu(x, 0.1),
    # reductions
    "sum0": lambda r, x, y: x.sum(0, keepdim=True).expand(4, 4),
    "mean1": lambda r, x, y: x.mean(1, keepdim=True).expand_as(x),
    "amax": lambda r, x, y: x.amax(1, keepdim=True) * x,
    "softmax": lambda r, x, y: x.softmax(1),
    "logsumexp": lambda r, x, y: x.logsumexp(0, keepdim=True) + x,
    "cumsum": lambda r, x, y: x.cumsum(1),
    "normalize": lambda r, x, y: x / (x.norm() + 1),
    "var": lambda r, x, y: x.var(0, keepdim=True) * x,
    "sort": lambda r, x, y: x.sort(1).values,
    "topk": lambda r, x, y: x.topk(2, 1).values.repeat(1, 2),
    "scalar": lambda r, x, y: x.sum() * x,  # through a 0-d tensor
    # views and shape changes
    "t": lambda r, x, y: x.t(),
    "flip": lambda r, x, y: x.reshape(2, 8).flip(1).reshape(4, 4),
    "contig_t": lambda r, x, y: x.transpose(0, 1).contiguous(),
    "expand": lambda r, x, y: x[:1].expand(4, 4),
    "view": lambda r, x, y: x.view(16).view(4, 4),  # fails on a non-contiguous x, bare and watched alike
    "permute": lambda r, x, y: x.reshape(2, 2, 4).permute(1, 0, 2).reshape(4, 4),
    "as_strided": lambda r, x, y: x.as_strided((4, 4), (1, 4)),
    "roll": lambda r, x, y: x.roll(1, 0),
    "unsqueeze": lambda r, x, y: x.unsqueeze(0).squeeze(0),
    "cat_halves": lambda r, x, y: torch.cat([x[2:], x[:2]]),
    "diag": lambda r, x, y: torch.diag_embed(x.diagonal()) + x,
    # indexing
    "index": lambda r, x, y: x[PERM],
    "gather": lambda r, x, y: x.gather(1, GATHER),
    "index_select": lambda r, x, y: x.index_select(1, PERM),
    "masked_fill": lambda r, x, y: x.masked_fill(MASK, 0.0),
    "index_put": lambda r, x, y: x.index_put((ROWS,), y[1:3] * 2),
    "scatter": lambda r, x, y: torch.zeros(4, 4).scatter(1, GATHER.argsort(1), x),
    # elementwise binary and matrix ops
    "add": lambda r, x, y: x + y,
    "sub": lambda r, x, y: x - y,
    "mul": lambda r, x, y: x * y,
    "div": lambda r, x, y: x / (y.abs() + 1),
    "maximum": lambda r, x, y: torch.maximum(x, y),
    "where": lambda r, x, y: torch.where(x > 0, x, y),
    "lerp": lambda r, x, y: torch.lerp(x, y, 0.3),
    "addcmul": lambda r, x, y: torch.addcmul(x, x, y, value=0.5),
    "matmul": lambda r, x, y: x @ y,
    "einsum": lambda r, x, y: torch.einsum("ij,kj->ik", x, y),
    "bmm": lambda r, x, y: torch.bmm(x.unsqueeze(0), y.unsqueeze(0)).squeeze(0),
    "linear": lambda r, x, y: F.linear(x, y),
    "cat_slice": lambda r, x, y: torch.cat([x, y])[2:6],
    "stack_mean": lambda r, x, y: torch.stack([x, y]).mean(0),
    # parameters, convolutions
    "param_mul": lambda r, x, y: x * r.params[0],
    "param_linear": lambda r, x, y: F.linear(x, r.params[1]),
    "conv1d": lambda r, x, y: F.conv1d(x.unsqueeze(0), r.conv1d_weight, padding=1).squeeze(0),
    "conv2d": lambda r, x, y: F.conv2d(x.reshape(1, 1, 4, 4), r.conv2d_weight, padding=1).reshape(4, 4),
    "conv1d_w": lambda r, x, y: F.conv1d(x.unsqueeze(0), y.unsqueeze(-1)).squeeze(0),
    "conv2d_w": lambda r, x, y: F.conv2d(x.reshape(1, 1, 4, 4), y[:3, :3].reshape(1, 1, 3, 3), padding=1).reshape(4, 4),
    # custom Functions, checkpoint
    "cube": lambda r, x, y: Cube.apply(x),
    "mulexp": lambda r, x, y: MulExp.apply(x, y),
    "checkpoint": lambda r, x, y: checkpoint(_sin_cos, x, use_reentrant=False),
}


def _nograd_sub(r: Any, x: torch.Tensor, y: torch.Tensor) -> None:
    with torch.no_grad():  # what an optimizer does to a parameter
        x.sub_(0.1 * y)


# In-place ops change x (the first operand); the pool keeps x.
INPLACE: dict[str, Callable[[Any, torch.Tensor, torch.Tensor], object]] = {
    "add_": lambda r, x, y: x.add_(1),
    "mul_": lambda r, x, y: x.mul_(y),
    "sigmoid_": lambda r, x, y: x.sigmoid_(),  # saves its own (in-place) result
    "relu_": lambda r, x, y: x.relu_(),
    "clamp_": lambda r, x, y: x.clamp_(-1, 1),
    "view_mul_": lambda r, x, y: x[1:3].mul_(2),  # through a view: CopySlices
    "row_zero_": lambda r, x, y: x[0].zero_(),
    "t_add_": lambda r, x, y: x.t().add_(y),
    "copy_": lambda r, x, y: x.copy_(y),
    "index_add_": lambda r, x, y: x.index_add_(0, PERM, y),
    "masked_fill_": lambda r, x, y: x.masked_fill_(MASK, 0.5),
    "nograd_sub_": _nograd_sub,
    "detach_": lambda r, x, y: x.detach_(),
}
# Not generated: `.data = ...` on a saved tensor.  Its gradients are checked by the regression tests at the
# end; its memory cannot match torch's under any saved-tensor hooks (torch re-wraps what an unpack hook
# returns, and a graph made by a create_graph backward then holds the old storage), so the lifetime check
# of the fuzzing would flag it.

CONTROL = ("detach", "detach_leaf", "nograd", "zero_grad", "sgd", "drop", "retain_grad")
BACKWARDS = ("sum", "ones", "multi", "grad", "grad_create", "grad_wrt", "again", "again")


# ------------------------------------------------------------- the programs
_index = st.one_of(st.integers(0, 3), st.integers(0, 1 << 12))  # mostly recent tensors
_instruction = st.one_of(
    st.tuples(st.just("op"), st.sampled_from(sorted(OPS)), _index, _index, st.booleans()),
    st.tuples(st.just("op"), st.sampled_from(sorted(OPS)), _index, _index, st.booleans()),
    st.tuples(st.just("backward"), st.sampled_from(BACKWARDS), _index, _index, st.booleans()),
    st.tuples(st.just("inplace"), st.sampled_from(sorted(INPLACE)), _index, _index, st.booleans()),
    st.tuples(st.just("control"), st.sampled_from(CONTROL), _index, _index, st.booleans()),
)
_step = st.tuples(st.lists(_instruction, min_size=1, max_size=12), st.lists(_index, max_size=3))
programs = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 2**16),
        "steps": st.lists(_step, min_size=1, max_size=4),
        "keep_steps": st.sampled_from([1, 2, 20]),
        "snapshots": st.sampled_from(["off", "off", "off", "auto"]),
        "explicit_steps": st.booleans(),
    }
)


# Classic patterns, always run first (hypothesis's explicit examples); the pool starts each step as
# [batch, param0, param1, carried...], and index 0 picks the newest tensor.
TWICE_SAME_STEP = [
    ([("op", "exp", 0, 0, False), ("backward", "sum", 0, 0, False), ("backward", "again", 0, 0, False)], [])
]
TWICE_NEXT_STEP = [
    ([("op", "tanh", 0, 0, False), ("op", "mul", 0, 1, False), ("backward", "sum", 0, 0, False)], [0]),
    ([("op", "add", 0, 1, False), ("backward", "sum", 0, 0, False)], []),  # through last step's freed graph
]
INPLACE_ON_SAVED_OUTPUT = [
    ([("op", "sigmoid", 0, 0, False), ("inplace", "add_", 0, 0, False), ("backward", "sum", 0, 0, False)], [])
]
OPTIMIZER_STEP_THEN_RETAINED_GRAPH = [
    ([("op", "param_mul", 1, 0, False), ("op", "exp", 0, 0, False), ("backward", "sum", 0, 0, True),
      ("control", "sgd", 0, 0, False), ("backward", "again", 0, 0, False)], []),  # saved parameter changed
]
DOUBLE_BACKWARD = [
    ([("op", "mulexp", 0, 1, False), ("backward", "grad_create", 0, 0, True), ("op", "cube", 0, 0, False),
      ("backward", "sum", 0, 0, False)], []),
]


def _classic(steps: list) -> dict:
    return {"seed": 1, "steps": steps, "keep_steps": 20, "snapshots": "auto", "explicit_steps": False}


class Program:
    """Interprets one generated program; logs values, gradients, errors and warnings, never holding graphs."""

    def __init__(self, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.gen = gen
        self.params = [torch.randn(4, 4, generator=gen).requires_grad_() for _ in range(2)]
        self.conv1d_weight = (torch.randn(4, 4, 3, generator=gen) * 0.3).requires_grad_()
        self.conv2d_weight = (torch.randn(1, 1, 3, 3, generator=gen) * 0.3).requires_grad_()
        self.leaves = [*self.params, self.conv1d_weight, self.conv2d_weight]  # gradients compared after each backward
        self.inputs = list(self.params)  # the 4x4 leaves that start each step's pool
        self.log: list[tuple] = []
        self.refs: list[tuple[weakref.ref, StorageWeakRef]] = []
        self.pool: list[torch.Tensor] = []
        self.last: Callable[[bool], object] | None = None  # repeats the last backward call
        self.stats: Counter = Counter()
        for leaf in self.leaves:
            self._watch(leaf)

    # -------------------------------------------------------------- helpers
    def _watch(self, t: torch.Tensor) -> None:
        self.refs.append((weakref.ref(t), StorageWeakRef(t.untyped_storage())))

    def _add(self, t: torch.Tensor) -> None:
        self._watch(t)
        self.pool.append(t)
        self.log.append(("value", t.detach().clone()))

    def _pick(self, i: int, among: list[torch.Tensor] | None = None) -> torch.Tensor:
        pool = among or self.pool
        return pool[len(pool) - 1 - i % len(pool)]  # small i: recent tensors

    def _root(self, i: int) -> torch.Tensor:
        """Mostly a tensor with a graph; sometimes anything (torch's "does not require grad" error)."""
        return self._pick(i, None if i % 16 == 15 else [t for t in self.pool if t.requires_grad])

    def _target(self, i: int) -> torch.Tensor:
        """Mostly a tensor that is not a leaf requiring grad; sometimes anything (torch's leaf error)."""
        return self._pick(i, None if i % 16 == 15 else [t for t in self.pool if not (t.is_leaf and t.requires_grad)])

    def _log_grads(self) -> None:
        self.log.append(("grads", [None if p.grad is None else p.grad.detach().clone() for p in self.leaves]))

    def alive(self) -> list[tuple[bool, bool]]:
        return [(ref() is not None, not storage.expired()) for ref, storage in self.refs]

    # ------------------------------------------------------------ execution
    def run(self, steps: list, step_block: Callable[[], Any]) -> None:
        for number, (instructions, carry) in enumerate(steps):
            with step_block():
                batch = torch.randn(4, 4, generator=self.gen)
                self._watch(batch)
                self.pool = [batch, *self.inputs, *self.pool]
                for instruction in instructions:
                    self._execute(instruction)
                carried = [self._pick(i) for i in carry] if self.pool else []
                self.pool = [t for t in carried if not any(t is leaf for leaf in self.inputs)]
            self.log.append(("alive", number, self.alive()))
        self.pool = []
        self.last = None

    def _execute(self, instruction: tuple) -> None:
        kind, name, i, j, flag = instruction
        self.stats[kind] += 1
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                getattr(self, f"_{kind}")(name, i, j, flag)
            except Exception as exc:  # logged and compared, never held (a traceback holds tensors)
                self.log.append(("error", kind, name, type(exc), str(exc)))
                self.stats["errors"] += 1
                self.stats[_error_class(str(exc))] += 1
        for w in caught:
            self.log.append(("warning", w.category, str(w.message)))

    def _op(self, name: str, i: int, j: int, flag: bool) -> None:
        self._add(OPS[name](self, self._pick(i), self._pick(j)))

    def _inplace(self, name: str, i: int, j: int, flag: bool) -> None:
        x = self._target(i)
        INPLACE[name](self, x, self._pick(j))
        self.log.append(("value", x.detach().clone()))

    def _control(self, name: str, i: int, j: int, flag: bool) -> None:
        x = self._pick(i)
        if name == "detach":
            self._add(x.detach())
        elif name == "detach_leaf":
            leaf = x.detach().clone().requires_grad_()
            self.leaves.append(leaf)
            self.inputs.append(leaf)
            self._add(leaf)
        elif name == "nograd":
            with torch.no_grad():
                self._add(x * 2 + 1)
        elif name == "zero_grad":
            for p in self.leaves:
                p.grad = None
        elif name == "sgd":
            with torch.no_grad():
                for p in self.params:
                    if p.grad is not None:
                        p.sub_(0.01 * p.grad)
        elif name == "drop":  # a graph dropped without backward (collected with its node)
            del self.pool[len(self.pool) - 1 - i % len(self.pool)]
            if not self.pool:
                self.pool.append(self.params[0])
        elif name == "retain_grad":
            x.retain_grad()

    def _backward(self, name: str, i: int, j: int, retain: bool) -> None:
        self.stats["backwards"] += 1
        x, y = self._root(i), self._root(j)
        if name == "again":
            if self.last is None:
                return
            call = self.last
        elif name == "sum":
            root = x.sum()
            self._watch(root)

            def call(retain: bool, root=root) -> None:
                root.backward(retain_graph=retain)

        elif name == "ones":

            def call(retain: bool, x=x) -> None:
                x.backward(torch.ones_like(x), retain_graph=retain)

        elif name == "multi":
            roots = [x.sum(), y.mean()]

            def call(retain: bool, roots=roots) -> None:
                torch.autograd.backward(roots, retain_graph=retain)

        else:
            if name == "grad_wrt":  # with respect to a non-leaf tensor
                inputs = [self._pick(j)]
                root = x.sum()
            else:
                inputs = [p for p in self.leaves if p.requires_grad]
                root = x.pow(2).sum() if name == "grad_create" else x.sum()
            self._watch(root)
            create = name == "grad_create"

            def call(retain: bool, root=root, inputs=inputs, create=create) -> None:
                grads = torch.autograd.grad(root, inputs, retain_graph=retain, create_graph=create, allow_unused=True)
                self.log.append(("autograd.grad", [None if g is None else g.detach().clone() for g in grads]))
                if create:  # gradients with a graph: double backward later
                    for g in grads:
                        if g is not None and g.shape == (4, 4):
                            self._add(g)

        self.last = call
        try:
            call(retain)
        finally:
            self._log_grads()


def _error_class(message: str) -> str:
    if "backward through the graph a second time" in message:
        return "backward-twice errors"
    if message.startswith(INPLACE_PHRASE):
        return "in-place errors"
    return "other errors"


# ------------------------------------------------------------- comparison
def _bits(t: torch.Tensor) -> tuple:
    return t.dtype, tuple(t.shape), t.contiguous().reshape(-1).view(torch.uint8)


def _same_tensor(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is b
    (da, sa, ba), (db, sb, bb) = _bits(a), _bits(b)
    return da == db and sa == sb and torch.equal(ba, bb)


def _same_error(bare: tuple, watched: tuple) -> str | None:
    """None when the watched error matches the bare one; else what differs."""
    _, kind, name, bare_type, bare_msg = bare
    _, kind_w, name_w, watched_type, watched_msg = watched
    if (kind, name) != (kind_w, name_w):
        return f"errors in different instructions: {kind} {name} vs {kind_w} {name_w}"
    if not issubclass(watched_type, bare_type):
        return f"{watched_type.__name__} raised instead of {bare_type.__name__}: {watched_msg!r}"
    if watched_msg == bare_msg:
        return None
    if watched_msg.startswith(bare_msg + "\n\n"):  # torch's text first and unchanged, then graphwatch's
        return None
    return f"torch's message is not the start of graphwatch's:\n  bare:    {bare_msg!r}\n  watched: {watched_msg!r}"


def _compare(bare: list[tuple], watched: list[tuple], objects_exact: bool = True) -> None:
    """Assert the two logs agree.  ``objects_exact``: a tensor's Python object must not die earlier under
    graphwatch either (False for programs with a create_graph backward: torch re-wraps every tensor an
    unpack hook returns, so the double-backward graph holds a new object for a saved input, not the
    user's; the storage, which is what costs memory, is still compared both ways)."""
    for n, (b, w) in enumerate(zip(bare, watched)):
        where = f"log entry {n}"
        assert b[0] == w[0], f"{where}: bare logged {b[:3]}, watched logged {w[:3]}"
        kind = b[0]
        if kind == "value":
            assert _same_tensor(b[1], w[1]), f"{where}: forward values differ"
        elif kind in ("grads", "autograd.grad"):
            assert len(b[1]) == len(w[1])
            different = [k for k, (gb, gw) in enumerate(zip(b[1], w[1])) if not _same_tensor(gb, gw)]
            assert not different, f"{where}: gradients of inputs {different} differ"
        elif kind == "error":
            problem = _same_error(b, w)
            assert problem is None, f"{where}: {problem}"
        elif kind == "warning":
            assert b[1:] == w[1:], f"{where}: warnings differ: {b[1:]} vs {w[1:]}"
        elif kind == "alive":
            longer = [k for k, (ab, aw) in enumerate(zip(b[2], w[2])) if aw[0] > ab[0] or aw[1] > ab[1]]
            assert not longer, f"end of step {b[1]}: tensors {longer} alive under graphwatch only"
            shorter = [
                k for k, (ab, aw) in enumerate(zip(b[2], w[2])) if aw[1] < ab[1] or (objects_exact and aw[0] < ab[0])
            ]
            assert not shorter, f"end of step {b[1]}: tensors {shorter} dead under graphwatch only"
    assert len(bare) == len(watched), f"bare logged {len(bare)} entries, watched {len(watched)}"


def _outlived(bare: list[tuple[bool, bool]], watched: list[tuple[bool, bool]]) -> list[int]:
    return [k for k, (ab, aw) in enumerate(zip(bare, watched)) if aw[0] > ab[0] or aw[1] > ab[1]]


@contextlib.contextmanager
def _refcounting_only() -> Iterator[None]:
    """gc off during a run: lifetimes are decided by reference counts alone, the same way twice."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.fixture(scope="module", autouse=True)
def _fast_gc():
    """gc.collect() scans only what the fuzzing makes (torch's own objects are frozen for the module, and what
    outlives each program is frozen after it)."""
    x = torch.ones(4, 4, requires_grad=True)  # first uses import torch._dynamo and graphwatch's renderers
    with graphwatch.watch(summary=False):
        checkpoint(_sin_cos, x, use_reentrant=False).sum().backward()
    del x
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


def _differential(program: dict, level: str, stats: Counter) -> None:
    stats["programs"] += 1
    stats["steps"] += len(program["steps"])
    stats[f"snapshots={program['snapshots']}"] += 1

    bare = Program(program["seed"])
    with _refcounting_only():
        bare.run(program["steps"], contextlib.nullcontext)
    bare_log, bare_refs = bare.log, bare.refs
    bare_stats = bare.stats
    del bare
    gc.collect()
    bare_alive = [(r() is not None, not s.expired()) for r, s in bare_refs]

    options = {"summary": False, "level": level, "keep_steps": program["keep_steps"], "snapshots": program["snapshots"]}
    with graphwatch.watch(**options) as gw:
        watched = Program(program["seed"])
        with _refcounting_only():
            watched.run(program["steps"], gw.step if program["explicit_steps"] else contextlib.nullcontext)
        watched_log, watched_refs = watched.log, watched.refs
        del watched
        gc.collect()
        inside = [(r() is not None, not s.expired()) for r, s in watched_refs]
    gc.collect()
    after = [(r() is not None, not s.expired()) for r, s in watched_refs]

    double_backward = any(step[1] == "grad_create" for instructions, _ in program["steps"] for step in instructions)
    _compare(bare_log, watched_log, objects_exact=not double_backward)
    assert not _outlived(bare_alive, inside), f"alive inside the session only: {_outlived(bare_alive, inside)}"
    assert not _outlived(bare_alive, after), f"alive after the session only: {_outlived(bare_alive, after)}"
    assert len(gw.trace.steps) >= 1
    stats.update(bare_stats)
    gc.freeze()  # what outlived this program (hypothesis's state mostly) is not scanned again by the next's collects


def _fuzz(level: str, examples: int) -> Counter:
    stats: Counter = Counter()

    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],  # no "explain": it traces every line
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @seed(zlib.crc32(level.encode()))  # a fixed seed per level: each level gets its own programs
    @given(program=programs)
    @example(program=_classic(TWICE_SAME_STEP))
    @example(program=_classic(TWICE_NEXT_STEP))
    @example(program=_classic(INPLACE_ON_SAVED_OUTPUT))
    @example(program=_classic(OPTIMIZER_STEP_THEN_RETAINED_GRAPH))
    @example(program=_classic(DOUBLE_BACKWARD))
    def check(program: dict) -> None:
        _differential(program, level, stats)

    check()
    print(f"\n[fuzz level={level}] " + ", ".join(f"{k}: {v}" for k, v in sorted(stats.items())))
    return stats


def _assert_covered(stats: Counter) -> None:
    """The fixed set really exercises the patterns the fuzzing is for."""
    for key in ("backward-twice errors", "in-place errors", "other errors", "backwards", "inplace", "op"):
        assert stats[key] > 0, f"no {key} among {stats['programs']} programs: {dict(stats)}"


# ------------------------------------------------------------------ the tests
def test_random_programs_are_unchanged_by_graphwatch_default_level():
    stats = _fuzz("default", EXAMPLES)
    _assert_covered(stats)


def test_random_programs_are_unchanged_by_graphwatch_light_level():
    stats = _fuzz("light", SIDE_EXAMPLES)
    assert stats["backwards"] > 0 and stats["errors"] > 0


def test_random_programs_are_unchanged_by_graphwatch_precise_level():
    stats = _fuzz("precise", SIDE_EXAMPLES)
    assert stats["backwards"] > 0 and stats["errors"] > 0


# ------------------------------------------------- the comparison itself is not vacuous
def test_comparison_catches_a_changed_gradient_and_a_changed_error():
    a, b = torch.tensor([1.0, float("nan")]), torch.tensor([1.0, float("nan")])
    assert _same_tensor(a, b)  # NaN payloads compare bit for bit
    assert not _same_tensor(a, torch.tensor([1.0, 2.0]))
    assert not _same_tensor(torch.tensor([0.0]), torch.tensor([-0.0]))  # bitwise, not ==
    with pytest.raises(AssertionError, match="gradients"):
        _compare([("grads", [a])], [("grads", [torch.tensor([1.0, 0.0])])])
    twice = "Trying to backward through the graph a second time (or directly access saved tensors ...)"
    ok = _same_error(("error", "backward", "sum", RuntimeError, twice),
                     ("error", "backward", "sum", graphwatch.BackwardTwiceError, twice + "\n\ngraphwatch: ..."))
    assert ok is None
    assert _same_error(("error", "backward", "sum", RuntimeError, twice),
                       ("error", "backward", "sum", ValueError, twice)) is not None
    assert _same_error(("error", "backward", "sum", RuntimeError, twice),
                       ("error", "backward", "sum", graphwatch.BackwardTwiceError, "graphwatch: " + twice)) is not None
    with pytest.raises(AssertionError, match="alive under graphwatch only"):
        _compare([("alive", 0, [(False, False)])], [("alive", 0, [(False, True)])])
    with pytest.raises(AssertionError, match="dead under graphwatch only"):
        _compare([("alive", 0, [(True, True)])], [("alive", 0, [(False, True)])])


def test_interpreter_reproduces_the_two_classic_errors():
    """Sanity of the generator's building blocks: both target errors come out of short programs."""
    # the pool starts as [4 leaves, input]: index 0 picks the newest tensor, index 4 the first parameter
    twice = [([("op", "exp", 4, 4, False), ("backward", "sum", 0, 0, False), ("backward", "again", 0, 0, False)], [])]
    inplace = [([("op", "exp", 4, 4, False), ("inplace", "add_", 0, 0, False), ("backward", "sum", 0, 0, False)], [])]
    for steps, expected in ((twice, "backward-twice errors"), (inplace, "in-place errors")):
        program = Program(0)
        with _refcounting_only():
            program.run(steps, contextlib.nullcontext)
        assert program.stats[expected] == 1, program.log
        stats: Counter = Counter()
        _differential({"seed": 0, "steps": steps, "keep_steps": 20, "snapshots": "auto", "explicit_steps": False},
                      "default", stats)
        assert stats[expected] == 1


# ------------------------------------------- what the fuzzing found, as plain regression tests
def _outcome(fn: Callable[[], torch.Tensor], watched: bool) -> tuple[str, object]:
    try:
        if watched:
            with graphwatch.watch(summary=False, snapshots="off"):
                return "ok", fn()
        return "ok", fn()
    except RuntimeError as exc:
        return type(exc).__name__, str(exc)


def _detach_saved_input() -> torch.Tensor:
    a = torch.ones(3, requires_grad=True)
    b = a * 2
    c = b * b  # saves b
    b.detach_()
    c.sum().backward()  # torch: "Trying to use a saved tensor that has been detached in-place"
    return a.grad


def _detach_saved_input_of_a_retained_graph() -> torch.Tensor:
    a = torch.ones(3, requires_grad=True)
    b = a * 2
    c = (b * b).sum()
    c.backward(retain_graph=True)
    b.detach_()
    c.backward()
    return a.grad


def _replace_data_of_a_saved_input() -> torch.Tensor:
    a = torch.ones(3, requires_grad=True)
    b = a * 2
    c = b * b  # saves b itself: the backward reads b's data as it is then
    b.data = torch.full((3,), 5.0)
    c.sum().backward()
    return a.grad  # 2 * 5 * 2


def _replace_data_of_a_saved_parameter() -> torch.Tensor:
    w = torch.ones(3, requires_grad=True)
    x = torch.full((3,), 2.0, requires_grad=True)
    y = (w * x).sum()  # saves w
    w.data = torch.full((3,), 7.0)  # as weight-swapping code does
    y.backward()
    return x.grad  # 7, not 1


def _replace_data_of_a_saved_output() -> torch.Tensor:
    a = torch.ones(3, requires_grad=True)
    b = a.exp()  # saves its output: torch keeps a copy, so new data is not seen
    b.data = torch.full((3,), 5.0)
    b.sum().backward()
    return a.grad


@pytest.mark.parametrize("fn", [_detach_saved_input, _detach_saved_input_of_a_retained_graph])
def test_detach_inplace_of_a_saved_tensor_raises_torchs_error_with_graphwatch_too(fn):
    bare, watched = _outcome(fn, False), _outcome(fn, True)
    assert bare[0] == "RuntimeError" and "detached in-place" in bare[1]
    assert watched == bare


@pytest.mark.parametrize("fn", [_replace_data_of_a_saved_input, _replace_data_of_a_saved_parameter])
def test_data_replaced_on_a_saved_tensor_gives_torchs_gradient_with_graphwatch_too(fn):
    bare, watched = _outcome(fn, False), _outcome(fn, True)
    assert bare[0] == watched[0] == "ok"
    assert _same_tensor(bare[1], watched[1]), (bare[1], watched[1])


def test_data_replaced_on_a_saved_output_is_not_seen_with_or_without_graphwatch():
    bare, watched = _outcome(_replace_data_of_a_saved_output, False), _outcome(_replace_data_of_a_saved_output, True)
    assert bare[0] == watched[0] == "ok"
    assert _same_tensor(bare[1], watched[1]), (bare[1], watched[1])
