"""Two losses, ``retain_graph=True`` on both backwards: the last one keeps the graph for nothing.

Bug: with a shared trunk and two heads, the first ``loss1.backward()`` needs
``retain_graph=True`` so that ``loss2.backward()`` can run through the trunk
again; but the last backward retains too, so the step's saved tensors outlive
the step instead of being freed.  Seed post 000 (``loss1.backward(retain_graph=True)``
then ``loss2.backward(retain_graph=True)``) and seed post 001 ("the last backward
must not retain").

Running it: runs to the end; the bug is silent (graphwatch reports it).
Fixed twin: ``multi_loss_retain_fixed.py``.
"""

import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    trunk = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
    cat_head, car_head = nn.Linear(64, 1), nn.Linear(64, 1)
    params = [*trunk.parameters(), *cat_head.parameters(), *car_head.parameters()]
    opt = torch.optim.SGD(params, lr=0.01)
    for _ in range(6):
        x = torch.randn(32, 16)
        features = trunk(x)
        loss1 = cat_head(features).pow(2).mean()
        loss2 = car_head(features).abs().mean()
        opt.zero_grad()
        loss1.backward(retain_graph=True)
        loss2.backward(retain_graph=True)  # graphwatch: retained
        opt.step()


if __name__ == "__main__":
    main()
