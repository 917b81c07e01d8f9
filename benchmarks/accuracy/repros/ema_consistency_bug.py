"""Reproduces: a mean teacher whose consistency target is computed outside torch.no_grad() and whose EMA update
is too: "Trying to backward through the graph a second time" two steps in (semi-supervised codebases' issue
trackers).  EXPECT: backward-through-freed-graph, graph-carried-across-steps
FIX:         tp.mul_(0.99).add_(0.01 * sp)  # HERE =>         with torch.no_grad(): tp.mul_(0.99).add_(0.01 * sp)
"""
import copy

import torch
from torch import nn

torch.manual_seed(0)
student = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
teacher = copy.deepcopy(student)
for p in teacher.parameters():
    p.requires_grad_(False)
opt = torch.optim.SGD(student.parameters(), lr=0.05)
for step in range(12):
    x = torch.randn(16, 8)
    y = x.sum(dim=1, keepdim=True)
    consistency = (student(x + 0.1 * torch.randn_like(x)) - teacher(x)).pow(2).mean()
    loss = (student(x) - y).pow(2).mean() + consistency
    opt.zero_grad()
    loss.backward()
    opt.step()
    for tp, sp in zip(teacher.parameters(), student.parameters()):
        tp.mul_(0.99).add_(0.01 * sp)  # HERE
    print(f"step {step}: loss {loss.item():.6f}")
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in [*student.parameters(), *teacher.parameters()]))
