"""Multi-task learning done right: ``retain_graph=True`` on the first backward only.

Fix of ``multi_loss_retain_bug.py``: the first backward retains the shared
trunk's graph for the second; the second (the last) frees it.  Seed post 001
(``loss1.backward(retain_graph=True); loss2.backward(); optimizer.step()``) and
seed post 000's fix.

Running it: trains for six steps, no error.  graphwatch reports nothing.
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
        loss2.backward()
        opt.step()


if __name__ == "__main__":
    main()
