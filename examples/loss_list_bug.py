"""A list of loss tensors for logging keeps every step's graph alive.

Bug: ``losses.append(loss)`` stores the tensor, and with it the step's
autograd graph; the list grows and no graph is ever collected.  Issue 3's list
("a list of losses").

Running it: runs to the end; the bug is silent (graphwatch reports it).
Fixed twin: ``loss_list_fixed.py``.
"""

import torch
from torch import nn
from torch.nn import functional as F


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for _ in range(8):
        x, y = torch.randn(32, 16), torch.randn(32, 1)
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss)  # graphwatch: kept
    print(f"last loss {losses[-1].item():.4f}")


if __name__ == "__main__":
    main()
