"""Gradient accumulation over micro-batches, reset after every optimizer step (correct).

Four micro-batches each call ``backward()``; their gradients add up in ``.grad``
and one ``optimizer.step()`` uses the sum, then ``optimizer.zero_grad()`` resets
it.  Seed post 001 ("循环遍历批处理并一次处理一次,在结束时累积渐变").  Not a
missing ``zero_grad``.

Running it: three optimizer steps of four micro-batches, no error.  graphwatch reports nothing.
"""

import torch
from torch import nn
from torch.nn import functional as F


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    accumulate = 4
    opt.zero_grad()
    for i in range(3 * accumulate):
        x, y = torch.randn(8, 8), torch.randn(8, 1)
        loss = F.mse_loss(model(x), y) / accumulate
        loss.backward()
        if (i + 1) % accumulate == 0:
            opt.step()
            opt.zero_grad()


if __name__ == "__main__":
    main()
