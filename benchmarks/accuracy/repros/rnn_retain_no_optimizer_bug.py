"""Reproduces: "retain_graph=True makes training slower every iteration" (hidden state never detached,
retain_graph added to silence the error, manual SGD, no optimizer).  EXPECT: graph-carried-across-steps
FIX:     h = cell(torch.randn(4, 8), h)  # HERE =>     h = h.detach()\n    h = cell(torch.randn(4, 8), h)
FIX: loss.backward(retain_graph=True) => loss.backward()
"""
import torch
from torch import nn

torch.manual_seed(0)
cell, head = nn.RNNCell(8, 16), nn.Linear(16, 1)
params = [*cell.parameters(), *head.parameters()]
h = torch.zeros(4, 16)
for step in range(10):
    h = cell(torch.randn(4, 8), h)  # HERE
    loss = head(h).pow(2).mean()
    for p in params:
        p.grad = None
    loss.backward(retain_graph=True)
    with torch.no_grad():
        for p in params:
            p -= 0.01 * p.grad
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in params))
