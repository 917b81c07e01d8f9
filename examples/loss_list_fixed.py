"""A list of losses for logging, kept as numbers: ``losses.append(loss.item())``.

Fix of ``loss_list_bug.py``: the list holds floats, not graphs.

Running it: trains for eight steps, no error.  graphwatch reports nothing.
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
        losses.append(loss.item())
    print(f"last loss {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
