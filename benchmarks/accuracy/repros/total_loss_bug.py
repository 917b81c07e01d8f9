"""Reproduces: "CUDA out of memory after some epochs: total_loss += loss" (forum FAQ).  EXPECT: graph-kept-alive
FIX: total_loss += loss  # HERE => total_loss += loss.item()
"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.Adam(model.parameters())
total_loss = 0
for step in range(10):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    total_loss += loss  # HERE
print(float(total_loss))
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in model.parameters()))
