"""Reproduces: pytorch/pytorch#6925, "Confusing error message in Criterion output Tensor in v0.4": the ImageNet
example's `AverageMeter` fed the loss tensor, `losses.update(loss, input.size(0))`; its `self.sum += val * n`
keeps every step's graph until memory runs out (the reporter's fix: `loss.item()` at the call).  The holder is an
attribute of an object kept in a dict.  EXPECT: graph-kept-alive
FIX: meters["loss"].update(loss, x.size(0)) => meters["loss"].update(loss.item(), x.size(0))
"""
import torch
from torch import nn


class AverageMeter:
    def __init__(self):
        self.sum = 0
        self.count = 0

    def update(self, val, n=1):
        self.sum += val * n  # HERE
        self.count += n

    @property
    def avg(self):
        return self.sum / self.count


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
meters = {"loss": AverageMeter()}
for step in range(10):
    x = torch.randn(16, 8)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    meters["loss"].update(loss, x.size(0))
    print(f"step {step} average loss {float(meters['loss'].avg):.6f}")
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in model.parameters()))
