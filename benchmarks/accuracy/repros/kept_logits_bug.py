"""Reproduces: validation logits kept for later metrics without detaching them: each step's graph stays
alive (forum).  The tensor has 32 elements: `.item()` would crash; `.detach()` (or no_grad around the
validation forward) is the fix.  EXPECT: graph-kept-alive
FIX:     val_history.append(val_logits)  # HERE =>     val_history.append(val_logits.detach())
"""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x_val, y_val = torch.randn(32, 8), torch.randn(32)
val_history = []
for step in range(10):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    val_logits = model(x_val).squeeze(1)
    val_history.append(val_logits)  # HERE
    print(f"step {step} loss {loss.item():.6f} val mse {(val_history[-1] - y_val).pow(2).mean().item():.6f}")
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in model.parameters()))
