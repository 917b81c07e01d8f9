"""A plain MLP training loop (correct): zero_grad, forward, backward, step.

Seed post 000's canonical loop.  Each backward frees its own graph.

Running it: trains for six steps, no error.  graphwatch reports nothing.
"""

import torch
from torch import nn
from torch.nn import functional as F


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(6):
        x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
