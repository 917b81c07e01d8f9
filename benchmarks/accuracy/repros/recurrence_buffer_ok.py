"""Correct twin of ``recurrence_into_buffer_bug.py``: the recurrence runs on ``h`` and each state is only
written into a preallocated output buffer, which nothing saved reads back (the pattern pytorch/pytorch#173888
moved the nn.RNN docstring's example away from, done right).  It looks like the bug; it is not.
EXPECT: silent
"""
import torch
from torch import nn

torch.manual_seed(0)
cell, head = nn.Linear(8, 8), nn.Linear(8, 1)
opt = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=0.1)
for step in range(6):
    h = torch.randn(4, 8)
    out = h.new_zeros(4, 5, 8)
    for t in range(5):
        h = torch.tanh(cell(h))
        out[:, t] = h
    loss = head(out).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.6f}")
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in [*cell.parameters(), *head.parameters()]))
