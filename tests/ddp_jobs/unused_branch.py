"""DDP's "Expected to have finished reduction in the prior iteration": a task head chosen by the rank.

Reproduces the case of open-mmlab/mmdetection#4742 and HamPerdredes/SOOD#33: a model whose forward runs a
different branch on different ranks (here each rank trains its own task head) under DistributedDataParallel
without ``find_unused_parameters=True``.  The other rank's head gets no gradient, so the reducer never finishes
the first iteration's reduction and the second forward raises.

EXPECT: ddp-unfinished-reduction
FIX: model = DistributedDataParallel(MultiTask()) => model = DistributedDataParallel(MultiTask(), find_unused_parameters=True)

Run it: ``torchrun --nproc-per-node 2 -m graphwatch run unused_branch.py``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel


class MultiTask(nn.Module):
    """A shared body and one head per task; ``forward(x, task)`` runs only the task's head."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.heads = nn.ModuleList([nn.Linear(16, 1), nn.Linear(16, 1)])

    def forward(self, x: torch.Tensor, task: int) -> torch.Tensor:
        head = self.heads[task]  # HERE
        return head(self.body(x))


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(MultiTask())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rank = dist.get_rank()
    data = torch.Generator().manual_seed(rank)
    for _ in range(2):
        x, y = torch.randn(4, 8, generator=data), torch.randn(4, 1, generator=data)
        opt.zero_grad()
        loss = F.mse_loss(model(x, task=rank), y)
        loss.backward()
        opt.step()
    print(sum(float(p.sum()) for p in model.parameters()))


if __name__ == "__main__":
    main()
