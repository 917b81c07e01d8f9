"""Reproduces: nn.ReLU(inplace=True) placed after a sigmoid, whose backward needs its own output (forum:
"modified by an inplace operation ... output 0 of SigmoidBackward0").  The line to name is the in-place
ReLU.  EXPECT: modified-in-place
FIX:     nn.ReLU(inplace=True),  # HERE =>     nn.ReLU(inplace=False),
"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(
    nn.Linear(8, 16),
    nn.Sigmoid(),
    nn.ReLU(inplace=True),  # HERE
    nn.Linear(16, 1),
)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    loss = (model(torch.randn(16, 8)) - 1).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.6f}")
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in model.parameters()))
