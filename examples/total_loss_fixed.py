"""A running total of the loss kept as a number: ``total_loss += loss.item()``.

Fix of ``total_loss_bug.py``: ``loss.item()`` is a Python float, so the total
holds no graph and each step's graph is freed when the step ends.

Running it: trains for eight steps, no error.  graphwatch reports nothing.
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
        total_loss += loss.item()
    print(f"mean loss {total_loss / 8:.4f}")


if __name__ == "__main__":
    main()
