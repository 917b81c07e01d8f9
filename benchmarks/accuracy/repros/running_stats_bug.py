"""Reproduces: pytorch/pytorch#20275, "Memory (CPU/sys) leak with custom batch norm layer": a hand-written batch
norm updates its running statistics from the batch's mean and variance, `self.running_mean = (1 - m) *
self.running_mean + m * mean`, with the batch's graph attached, so every step's graph stays reachable from the
module ("that `running_mean` update is exactly your problem. You keep extending the graph"); the fix detaches the
statistics before the update (also huangleiBuaa/IterNorm-pytorch#1, `mean.data`).  The holder is an attribute of
a submodule.  EXPECT: graph-kept-alive
FIX:             self.running_mean = (1 - self.momentum) * self.running_mean + self.momentum * mean  # HERE =>             self.running_mean = (1 - self.momentum) * self.running_mean + self.momentum * mean.detach()
FIX:             self.running_var = (1 - self.momentum) * self.running_var + self.momentum * var =>             self.running_var = (1 - self.momentum) * self.running_var + self.momentum * var.detach()
"""
import torch
from torch import nn


class HandBatchNorm(nn.Module):
    def __init__(self, features, momentum=0.1, eps=1e-5):
        super().__init__()
        self.momentum, self.eps = momentum, eps
        self.running_mean = torch.zeros(features)
        self.running_var = torch.ones(features)

    def forward(self, x):
        if self.training:
            mean, var = x.mean(0), x.var(0, unbiased=False)
            self.running_mean = (1 - self.momentum) * self.running_mean + self.momentum * mean  # HERE
            self.running_var = (1 - self.momentum) * self.running_var + self.momentum * var
        else:
            mean, var = self.running_mean, self.running_var
        return (x - mean) / torch.sqrt(var + self.eps)


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), HandBatchNorm(32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(30):
    x = torch.randn(16, 8)
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.6f}")
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in model.parameters()))
