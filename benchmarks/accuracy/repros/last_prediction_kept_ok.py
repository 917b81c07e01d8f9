"""Correct: a prediction made after the optimizer step for logging, reassigned every iteration (one
step of lag, not a leak).  EXPECT: silent"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x_probe = torch.randn(4, 8)
for i in range(10):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    probe = model(x_probe)
print(probe.sum().item())
