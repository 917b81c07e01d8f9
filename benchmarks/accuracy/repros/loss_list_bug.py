"""Reproduces: "memory leak when appending the loss to a list for plotting" (forum).  EXPECT: graph-kept-alive
FIX: history.append(loss)  # HERE => history.append(loss.item())
"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
history = []
for step in range(10):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    history.append(loss)  # HERE
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in model.parameters()))
