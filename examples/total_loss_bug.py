"""``total_loss += loss`` keeps every step's graph alive.

Bug: ``loss`` is a tensor with a graph; adding it to a running total links the
total to each step's graph, so no step's autograd nodes are ever collected:
memory grows with every step.  The total should be a number.  Issue 3's list
(``total_loss += loss``); seed post 000's tensor-valued ``loss +=`` loop is fine
within one step, before its backward (``summed_losses_correct.py``), not across steps.

Running it: runs to the end; the bug is silent (graphwatch reports it).
Fixed twin: ``total_loss_fixed.py``.
"""

import torch
from torch import nn
from torch.nn import functional as F


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    total_loss = 0.0
    for _ in range(8):
        x, y = torch.randn(32, 16), torch.randn(32, 1)
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        total_loss += loss  # graphwatch: kept
    print(f"mean loss {total_loss.item() / 8:.4f}")


if __name__ == "__main__":
    main()
