"""DistributedDataParallel where only the logging rank keeps every step's graph alive.

Bug: the last rank logs the running loss, and it adds the ``loss`` tensor
(``running += loss``): that rank's total links every step's graph, so its
autograd nodes are never collected and its memory grows with every step, while
the other ranks stay flat.  A rank-dependent branch, so a leak on one rank only.
Fix (``--fixed``): add a number, ``running += loss.item()``.

Run it (gloo on CPU, two processes; ``python -m torch.distributed.run`` works too)::

    torchrun --nproc-per-node 2 -m graphwatch run --out ddp-report examples/distributed/ddp_rank_leak.py
    torchrun --nproc-per-node 2 -m graphwatch run --out ddp-fixed examples/distributed/ddp_rank_leak.py --fixed

Each rank writes ``ddp-report/rank{r}/``; rank 0 prints the summary of both
ranks (``graph-kept-alive  only on rank 1``) and writes their joint report,
``ddp-report/index.html``.  The loop also uses the DDP machinery graphwatch
must leave alone: gradient buckets (small ones, so there are several),
``find_unused_parameters=True`` with a branch every other step skips, and
``no_sync()`` gradient accumulation over micro-batches.  (DDP's own warning that
``find_unused_parameters=True`` found no unused parameters comes from the odd
steps, which use the branch; the even ones skip it.)

This folder is not part of ``graphwatch demo`` (which runs examples in one
process).  ``tests/test_distributed.py`` imports :func:`make_model` and
:func:`train` to compare DDP's parameters with and without graphwatch.
"""

from __future__ import annotations

import argparse
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    """A small MLP with an auxiliary branch that ``forward(x, aux=False)`` skips (unused parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.ReLU())
        self.aux = nn.Linear(32, 32)
        self.head = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor, aux: bool = True) -> torch.Tensor:
        h = self.body(x)
        if aux:
            h = h + torch.sigmoid(self.aux(h))
        return self.head(h)


def make_model(find_unused: bool = True, bucket_cap_mb: float | None = 0.002) -> tuple[DDP, torch.optim.Optimizer]:
    """The model wrapped in DDP (the same initial weights on every rank) and its optimizer."""
    torch.manual_seed(0)
    options = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
    model = DDP(Net(), find_unused_parameters=find_unused, **options)
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def train(
    model: DDP, opt: torch.optim.Optimizer, rank: int, *, steps: int = 4, accumulate: int = 2,
    logging_rank: int = 1, fixed: bool = False,
) -> float:
    """``steps`` optimizer steps of ``accumulate`` micro-batches each; return the logging rank's mean loss."""
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own shard
    aux_every_step = not model.find_unused_parameters
    running = 0.0
    for step in range(steps):
        opt.zero_grad()
        for micro in range(accumulate):
            x, y = torch.randn(8, 8, generator=data), torch.randn(8, 1, generator=data)
            last = micro == accumulate - 1  # gradients are all-reduced on the last micro-batch only
            with nullcontext() if last else model.no_sync():
                loss = F.mse_loss(model(x, aux=aux_every_step or step % 2 == 1), y) / accumulate
                loss.backward()
        opt.step()
        if rank == logging_rank:
            if fixed:
                running += loss.item()
            else:
                running += loss  # graphwatch: kept
    mean = running / steps
    return mean.item() if isinstance(mean, torch.Tensor) else mean


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixed", action="store_true", help="log a number instead of the loss tensor")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model, opt = make_model()
    mean = train(model, opt, rank, steps=args.steps, logging_rank=world - 1, fixed=args.fixed)
    if rank == world - 1:
        print(f"rank {rank}: mean loss {mean:.4f}")
    del model, opt  # a DDP model still alive at destroy_process_group aborts gloo's teardown now and then
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
