"""Correct twin of meter_tensor_bug.py: the same `AverageMeter` in a dict, fed `loss.item()` as the fix of
pytorch/pytorch#6925 does; it keeps numbers, no graph.  EXPECT: silent
"""
import torch
from torch import nn


class AverageMeter:
    def __init__(self):
        self.sum = 0
        self.count = 0

    def update(self, val, n=1):
        self.sum += val * n
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
    meters["loss"].update(loss.item(), x.size(0))
    print(f"step {step} average loss {float(meters['loss'].avg):.6f}")
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in model.parameters()))
