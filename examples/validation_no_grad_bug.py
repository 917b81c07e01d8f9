"""A validation pass without ``torch.no_grad()`` whose losses are kept: their graphs never die.

Bug: the validation forward builds a graph (with saved activations) that no
backward will ever use; keeping the validation loss tensors in a history list
keeps those graphs, and their saved tensors, alive for the whole run.  Issue 3's
list ("a validation loop without ``no_grad``").

Running it: runs to the end; the bug is silent (graphwatch reports it).
Fixed twin: ``validation_no_grad_fixed.py``.
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
        val_loss = F.mse_loss(model(x_val), y_val)  # graphwatch: forward
        history.append(val_loss)  # graphwatch: kept
    print(f"best validation loss {min(v.item() for v in history):.4f}")


if __name__ == "__main__":
    main()
