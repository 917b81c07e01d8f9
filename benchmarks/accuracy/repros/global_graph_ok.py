"""Correct: one graph made before training and kept in a global (a sample output for logging); it never
grows.  EXPECT: silent"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
SAMPLE = model(torch.ones(1, 8))
for i in range(10):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print(SAMPLE.item())
