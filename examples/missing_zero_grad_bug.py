"""``optimizer.zero_grad()`` is never called: each step adds its gradients to all earlier ones.

Bug: ``loss.backward()`` accumulates into ``.grad``; without a reset every
``optimizer.step()`` uses the sum of all gradients so far.  Nothing fails, the
training is silently wrong.  Seed post 002's routine check ("在多个iters之间没调用
optimizer.zero_grad()"; it does not cause the backward-twice error itself) and
seed post 003 ("所以我们在训练模型的时候经常需要设计zero_grad()").

Running it: runs to the end; the bug is silent (graphwatch reports it).
Fixed twin: ``missing_zero_grad_fixed.py``; intended accumulation: ``grad_accumulation_correct.py``.
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
        loss.backward()
        opt.step()  # graphwatch: step


if __name__ == "__main__":
    main()
