"""Correct: gradient accumulation over 4 micro-batches.  EXPECT: silent"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
accumulation = 4
for i in range(16):
    loss = model(torch.randn(8, 8)).pow(2).mean() / accumulation
    loss.backward()
    if (i + 1) % accumulation == 0:
        opt.step()
        opt.zero_grad()
