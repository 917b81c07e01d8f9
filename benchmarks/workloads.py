"""Training-loop workloads for the overhead benchmark (see ``benchmarks/run.py``).

Each workload builds its model, data and optimizer once and returns a
:class:`Workload` whose ``step()`` runs one full iteration
(``zero_grad`` / forward / ``backward`` / ``optimizer.step``).  Every
configuration of a benchmark round runs the same ``step`` on the same objects,
so the only thing that differs between configurations is what watches.

The workloads, from the issue-5 brief:

- ``mlp``: the 8-layer 64-wide MLP of DESIGN.md fact 9, batch 32, SGD.  Many
  small ops: the worst case for any per-op cost.
- ``cnn``: a small convnet on 32x32 images where the convolutions dominate.
- ``lstm``: ``nn.LSTM`` over 50 time steps (on CPU a single fused autograd
  node covers the whole sequence, so the graph is tiny), and ``lstmcell``: the
  same sizes with ``nn.LSTMCell`` stepped in Python (a node-heavy graph).
- ``transformer``: one ``nn.TransformerEncoderLayer`` (training mode).
- ``rnn10k`` / ``rnn100k``: ``h = torch.tanh(h @ w)`` unrolled until the graph
  has 10,000 / 100,000 nodes: the deep-graph case (graph walks, recursion).
- ``grubug``: the classic bug itself, a GRU language model whose hidden state
  is carried into the next step without ``detach`` and backwarded with
  ``retain_graph=True`` (parameters updated through ``.data`` as in PyTorch's
  word-language-model example): each backward runs through every earlier
  step's graph of the round, so bare torch slows down too.
- ``manualsgd``: a step per backward and no optimizer (issue 42), the shape of
  PyTorch's ``examples/regression``: a 4->1 linear fit of a quartic on fresh
  batches, its parameters updated by hand under ``no_grad``; tiny steps.  Run
  as a script (``python benchmarks/workloads.py``) it is also the whole-process
  workload of ``whole_process.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class Workload:
    name: str
    description: str
    step: Callable[[], Any]  # one training iteration
    steps_per_round: int  # full run; --quick scales it down
    rounds: int  # full run; --quick scales it down
    nodes: int = 0  # autograd nodes in one step's graph (AccumulateGrad excluded)
    deep: bool = False  # run with a low recursion limit
    skip: tuple[str, ...] = field(default_factory=tuple)  # configurations not run here (too slow)
    skip_reason: str = ""
    group: str = ""  # workloads of one group are measured together, interleaved (and compared with each other)
    begin: Callable[[], None] | None = None  # before each round: a state carried from step to step starts afresh
    params: tuple[torch.Tensor, ...] = ()  # the trained parameters, where a run's result is read from them


def count_nodes(root: Any) -> int:
    """Distinct autograd nodes reachable from ``root`` (iterative; AccumulateGrad excluded)."""
    seen: set[int] = set()
    stack = [root]
    count = 0
    keep = []  # hold visited nodes so id() values are not reused during the walk
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        keep.append(node)
        if node.name() != "torch::autograd::AccumulateGrad":
            count += 1
        stack.extend(child for child, _ in node.next_functions)
    return count


def _training_step(opt: torch.optim.Optimizer, loss_fn: Callable[[], torch.Tensor]) -> Callable[[], None]:
    def step() -> None:
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        opt.step()

    return step


def _workload(
    name: str, description: str, opt: torch.optim.Optimizer, loss: Callable[[], torch.Tensor], steps: int, rounds: int
) -> Workload:
    """A training loop on ``loss``; its nodes counted on one extra graph."""
    return Workload(name, description, _training_step(opt, loss), steps, rounds, nodes=count_nodes(loss().grad_fn))


def mlp() -> Workload:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(8):
        layers += [nn.Linear(64, 64), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 64), torch.randn(32, 64)
    description = "8x Linear(64,64)+ReLU, batch 32, MSE, SGD (DESIGN fact 9)"
    return _workload("mlp", description, opt, lambda: F.mse_loss(model(x), y), 40, 31)


def cnn() -> Workload:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    description = "4 conv layers (3-16-32-32-32, 3x3) on 8x3x32x32, cross-entropy, SGD+momentum"
    return _workload("cnn", description, opt, lambda: F.cross_entropy(model(x), y), 6, 21)


def _sequence(
    name: str,
    description: str,
    rnn: nn.Module,
    x_shape: tuple[int, ...],
    last: Callable[[torch.Tensor], torch.Tensor],
    steps: int,
) -> Workload:
    """An LSTM over 50 time steps (hidden 64, batch 16) and a linear head on its last output, Adam."""
    head = nn.Linear(64, 1)
    opt = torch.optim.Adam([*rnn.parameters(), *head.parameters()], lr=1e-3)
    x, y = torch.randn(*x_shape), torch.randn(16, 1)
    return _workload(name, description, opt, lambda: F.mse_loss(head(last(x)), y), steps, 21)


def lstm() -> Workload:
    """``nn.LSTM`` over 50 time steps: on CPU one fused autograd node does the whole sequence."""
    torch.manual_seed(0)
    rnn = nn.LSTM(32, 64, batch_first=True)
    description = "nn.LSTM(32->64) over 50 time steps, batch 16, Adam (fused: few nodes)"
    return _sequence("lstm", description, rnn, (16, 50, 32), lambda x: rnn(x)[0][:, -1], 8)


def lstm_cell() -> Workload:
    """``nn.LSTMCell`` stepped 50 times in Python: the hand-written RNN pattern, ~15 nodes per time step."""
    torch.manual_seed(0)
    cell = nn.LSTMCell(32, 64)

    def last(x: torch.Tensor) -> torch.Tensor:
        h = c = torch.zeros(16, 64)
        for t in range(50):
            h, c = cell(x[t], (h, c))
        return h

    description = "nn.LSTMCell(32->64) looped over 50 time steps, batch 16, Adam"
    return _sequence("lstmcell", description, cell, (50, 16, 32), last, 6)


def transformer() -> Workload:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=256, dropout=0.1, batch_first=True)
    layer.train()
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-4)
    x = torch.randn(16, 32, 128)
    description = "TransformerEncoderLayer(d=128, 4 heads, ff=256), batch 16 x seq 32, AdamW"
    return _workload("transformer", description, opt, lambda: layer(x).pow(2).mean(), 10, 21)


def unrolled_rnn(nodes: int) -> Workload:
    """``h = tanh(h @ w)`` unrolled until the graph has ``nodes`` nodes (two per time step)."""
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(8, 8) * 0.3)
    h0 = torch.randn(1, 8)
    length = (nodes - 1) // 2  # mm + tanh per time step, plus the final sum

    def loss() -> torch.Tensor:
        h = h0
        for _ in range(length):
            h = torch.tanh(h @ w)
        return h.sum()

    opt = torch.optim.SGD([w], lr=1e-4)
    # Walking a graph from Python (next_functions) makes torch 2.13 free it recursively in C++ afterwards,
    # which overflows the 8 MB C stack from ~40,000 chained nodes (see README.md).  So count a small
    # unrolled graph by walking it, and scale: the graph is exactly 2 nodes per time step plus the sum.
    counted = 2 * length + 1
    if nodes <= 20_000:
        assert count_nodes(loss().grad_fn) == counted
    name = f"rnn{nodes // 1000}k"
    big = nodes >= 50_000
    return Workload(
        name,
        f"h = tanh(h @ w) unrolled {length:,} times (h 1x8, w 8x8), SGD",
        _training_step(opt, loss),
        3,  # the first step pays the session's one-off costs (snapshot, records): the later ones show the steady cost
        4,
        nodes=counted,
        deep=True,
        group="rnn",
        skip=("anomaly", "profiler") if big else (),
        skip_reason="detect_anomaly and the profiler are not run on the 100k graph (tens of seconds per step)"
        if big
        else "",
    )


def gru_carried_bug(segments: int = 8) -> Workload:
    """A GRU language model (vocabulary 100, 20 tokens x batch 8, hidden 64) that carries its hidden state
    without ``detach`` and backwards with ``retain_graph=True``; each round, and every ``segments`` steps of a
    longer one, starts a new state."""
    torch.manual_seed(0)
    vocab, hidden_size, batch = 100, 64, 8
    embed, gru, head = nn.Embedding(vocab, 32), nn.GRU(32, hidden_size), nn.Linear(hidden_size, vocab)
    params = [*embed.parameters(), *gru.parameters(), *head.parameters()]
    tokens = torch.randint(0, vocab, (21, batch))
    state: dict[str, Any] = {}

    def begin() -> None:
        state["hidden"] = torch.zeros(1, batch, hidden_size)
        state["steps"] = 0

    def loss() -> torch.Tensor:
        output, state["hidden"] = gru(embed(tokens[:-1]), state["hidden"])  # the bug: never detached
        return F.cross_entropy(head(output).reshape(-1, vocab), tokens[1:].reshape(-1))

    def step() -> None:
        if state["steps"] == segments:  # a new segment: a session longer than a round stays linear in its steps
            begin()
        state["steps"] += 1
        for p in params:
            p.grad = None
        loss().backward(retain_graph=True)  # the "fix" that hides the error and keeps every graph
        with torch.no_grad():
            for p in params:
                p.data.add_(p.grad, alpha=-0.1)  # (as the example does: no version bump, no in-place error)

    begin()
    nodes = count_nodes(loss().grad_fn)
    begin()
    description = f"GRU LM (vocab 100, 20x8 tokens, hidden 64), hidden carried + retain_graph=True, {segments} steps a round"
    return Workload("grubug", description, step, segments, 21, nodes=nodes, begin=begin)


SGD_STEPS = 758  # the steps PyTorch's regression example took in issue 42's measurement
SGD_RATE = 0.05


def manual_sgd() -> Workload:
    """A step per backward, no optimizer: ``Linear(4, 1)`` fitted to a fixed quartic (features x, x^2, x^3, x^4 of
    32 fresh normal samples a step) with smooth L1 loss, each parameter updated by hand under ``no_grad``."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    params: tuple[torch.Tensor, ...] = tuple(model.parameters())
    true_weight, true_bias = torch.randn(4, 1), torch.randn(1)
    powers = torch.arange(1, 5)

    def loss() -> torch.Tensor:
        features = torch.randn(32, 1) ** powers
        return F.smooth_l1_loss(model(features), features @ true_weight + true_bias)

    def step() -> None:
        loss().backward()
        with torch.no_grad():
            for p in params:
                p -= SGD_RATE * cast(torch.Tensor, p.grad)
                p.grad = None

    description = "Linear(4->1) on a quartic, batch 32, smooth L1, manual SGD under no_grad: a step per backward"
    nodes = count_nodes(loss().grad_fn)
    return Workload("manualsgd", description, step, 100, 21, nodes=nodes, params=params)


def all_workloads() -> dict[str, Callable[[], Workload]]:
    """Workload builders by name, in the order the benchmark runs them."""
    return {
        "mlp": mlp,
        "cnn": cnn,
        "lstm": lstm,
        "lstmcell": lstm_cell,
        "transformer": transformer,
        "rnn10k": lambda: unrolled_rnn(10_000),
        "rnn100k": lambda: unrolled_rnn(100_000),
        "grubug": gru_carried_bug,
        "manualsgd": manual_sgd,
    }


LEAK_EVERY = 1000  # the long run keeps one step's graph alive every this many steps


def tiny(leak_every: int = LEAK_EVERY) -> Callable[[], None]:
    """The long-run loop: a 8->1 linear model, batch 4 (as cheap as a training step gets).

    Every ``leak_every``-th step keeps its loss in a list (``kept.append(loss)``):
    a periodic leak, so that the run has findings to record as it goes (0: no leak).
    """
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    kept: list[torch.Tensor] = []
    count = 0

    def step() -> None:
        nonlocal count
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        count += 1
        if leak_every and count % leak_every == 0:
            kept.append(loss)  # the leak: this step's graph stays alive

    return step


def main() -> None:
    """The whole-process workload of ``whole_process.py``: :data:`SGD_STEPS` steps of :func:`manual_sgd` (or as many
    as the first argument says), then the trained parameters' sums."""
    import sys

    torch.set_num_threads(1)
    workload = manual_sgd()
    for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else SGD_STEPS):
        workload.step()
    print(" ".join(f"{p.sum().item():.6f}" for p in workload.params))


if __name__ == "__main__":
    main()
