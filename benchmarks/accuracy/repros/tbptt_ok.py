"""Correct: truncated BPTT, the hidden state detached at the start of each chunk.  EXPECT: silent"""
import torch
from torch import nn

torch.manual_seed(0)
cell, head = nn.GRUCell(8, 16), nn.Linear(16, 1)
opt = torch.optim.Adam([*cell.parameters(), *head.parameters()], lr=1e-3)
h = torch.zeros(4, 16)
for chunk in range(8):
    h = h.detach()
    loss = 0
    for t in range(5):
        h = cell(torch.randn(4, 8), h)
        loss = loss + head(h).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
