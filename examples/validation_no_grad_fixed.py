"""Evaluation under ``torch.no_grad()``: the validation pass builds no graph.

Fix of ``validation_no_grad_bug.py``: inside ``torch.no_grad()`` no autograd
graph is recorded, so the kept validation losses hold only their values.

Running it: trains for eight steps, no error.  graphwatch reports nothing.
"""

import torch
from torch import nn
from torch.nn import functional as F


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x_val, y_val = torch.randn(128, 16), torch.randn(128, 1)
    history = []
    for _ in range(8):
        x, y = torch.randn(32, 16), torch.randn(32, 1)
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            val_loss = F.mse_loss(model(x_val), y_val)
        history.append(val_loss)
    print(f"best validation loss {min(v.item() for v in history):.4f}")


if __name__ == "__main__":
    main()
