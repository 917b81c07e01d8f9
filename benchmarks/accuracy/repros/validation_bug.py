"""Reproduces: "GPU memory grows during validation" (evaluation without torch.no_grad(), losses kept).
EXPECT: graph-kept-alive
FIX:     val_losses.append(model(x_val).pow(2).mean())  # HERE =>     with torch.no_grad(): val_losses.append(model(x_val).pow(2).mean())
"""
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 32), nn.Linear(32, 1)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


torch.manual_seed(0)
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x_val = torch.randn(64, 8)
val_losses = []
for epoch in range(8):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    val_losses.append(model(x_val).pow(2).mean())  # HERE
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in model.parameters()))
