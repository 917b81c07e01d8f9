"""Reproduces: mean-teacher EMA update written without torch.no_grad(): memory grows every step (issue
trackers of semi-supervised codebases).  EXPECT: graph-kept-alive
FIX:         tp.mul_(0.99).add_(0.01 * sp) =>         with torch.no_grad(): tp.mul_(0.99).add_(0.01 * sp)
"""
import copy

import torch
from torch import nn

torch.manual_seed(0)
student = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
teacher = copy.deepcopy(student)
for p in teacher.parameters():
    p.requires_grad_(False)
opt = torch.optim.SGD(student.parameters(), lr=0.01)
for step in range(12):
    x = torch.randn(16, 8)
    with torch.no_grad():
        target = teacher(x)
    loss = (student(x) - target).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    for tp, sp in zip(teacher.parameters(), student.parameters()):
        tp.mul_(0.99).add_(0.01 * sp)
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in [*student.parameters(), *teacher.parameters()]))
