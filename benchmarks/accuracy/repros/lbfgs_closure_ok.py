"""Correct: LBFGS with a closure, using the documented `loss = optimizer.step(closure)`.  EXPECT: silent"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 1))
x, y = torch.randn(64, 3), torch.randn(64, 1)
optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=10)
for i in range(6):
    def closure():
        optimizer.zero_grad()
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        return loss
    loss = optimizer.step(closure)
    print(f"step {i}: {loss.item():.4f}")
