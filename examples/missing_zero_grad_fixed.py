"""``optimizer.zero_grad()`` before each backward: each step uses its own gradients.

Fix of ``missing_zero_grad_bug.py``.  Seed post 000's canonical loop
(``optimizer.zero_grad(); loss.backward(); optimizer.step()``).

Running it: trains for four steps, no error.  graphwatch reports nothing.
"""

import torch
from torch import nn
from torch.nn import functional as F


def main() -> None:
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(4):
        x, y = torch.randn(16, 8), torch.randn(16, 1)
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
