"""Reproduces: gradient norm logged with torch.autograd.grad before loss.backward() frees the graph
(forum).  EXPECT: backward-through-freed-graph
FIX: grads = torch.autograd.grad(loss, list(model.parameters())) => grads = torch.autograd.grad(loss, list(model.parameters()), retain_graph=True)
"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(3):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    grads = torch.autograd.grad(loss, list(model.parameters()))  # HERE
    opt.zero_grad()
    loss.backward()
    opt.step()
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in model.parameters()))
