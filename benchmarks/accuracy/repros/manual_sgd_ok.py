"""Correct: no optimizer, manual SGD on p.data (as in the char-RNN tutorial).  EXPECT: silent"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
for i in range(10):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    model.zero_grad()
    loss.backward()
    for p in model.parameters():
        p.data.add_(p.grad.data, alpha=-0.01)
