"""DDP's "Expected to mark a variable ready only once": one block run twice, each under reentrant checkpointing.

Reproduces the case of pytorch/pytorch#46166 (and linformer-pytorch#23: layer-wise shared parameters under
DistributedDataParallel): a module whose parameters are used by two reentrant backward passes in one iteration,
with ``find_unused_parameters=True``.  Each reentrant checkpoint runs its own backward, so the autograd hook of
the shared block's weight fires twice in one iteration and DDP's reducer raises.

EXPECT: ddp-ready-twice
FIX (on both checkpoint lines): use_reentrant=True => use_reentrant=False

Run it: ``torchrun --nproc-per-node 2 -m graphwatch run ready_twice.py``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint


class Tower(nn.Module):
    """An input layer, then one shared block applied twice (each application checkpointed), then a head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 16)
        self.block = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = checkpoint(self.block, self.stem(x), use_reentrant=True)
        return self.head(checkpoint(self.block, h, use_reentrant=True))  # HERE


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(Tower(), find_unused_parameters=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(2):
        x, y = torch.randn(4, 8, generator=data), torch.randn(4, 1, generator=data)
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    print(sum(float(p.sum()) for p in model.parameters()))


if __name__ == "__main__":
    main()
