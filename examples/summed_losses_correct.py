"""Losses summed inside one step, then a single backward (correct).

Seed post 000's second loop::

    for i in range(num):
        loss += Loss(input, target)
    optimizer.zero_grad(); loss.backward(); optimizer.step()

``loss`` is a tensor here on purpose: it is rebuilt every step and backwarded
once, so its graph is freed at each step's end.

Running it: trains for four steps, no error.  graphwatch reports nothing.
"""

import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    criterion = nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(4):
        loss = 0
        for _ in range(3):
            x, target = torch.randn(8, 8), torch.randn(8, 1)
            loss += criterion(model(x), target)
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
