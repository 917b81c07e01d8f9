"""Correct: multi-task loop, one backward per loss, retain_graph on all but the last.  EXPECT: silent"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(8):
    out = model(torch.randn(16, 8))
    losses = [out[:, 0].pow(2).mean(), out[:, 1].abs().mean()]
    opt.zero_grad()
    for k, loss in enumerate(losses):
        loss.backward(retain_graph=k < len(losses) - 1)
    opt.step()
