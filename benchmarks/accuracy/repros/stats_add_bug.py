"""Reproduces: MultimediaTechLab/YOLO#83, "[FIX] Fixes memory leak": a loss total kept as a tensor and added
to in place each batch (`total_loss[loss_name] += loss_val * batch_size` on a tensor of 0.0) holds every step's
graph, 1-2 MB a batch; the fix keeps numbers (`loss_val.item()`).  Here the total is a statistics object's tensor
grown with `add_`.  EXPECT: graph-kept-alive
FIX: stats.loss_sum.add_(loss * 16)  # HERE => stats.loss_sum.add_(loss.item() * 16)
"""
import torch
from torch import nn


class Stats:
    def __init__(self):
        self.loss_sum = torch.zeros(())
        self.seen = 0


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
stats = Stats()
for step in range(10):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    stats.loss_sum.add_(loss * 16)  # HERE
    stats.seen += 16
    print(f"step {step} mean loss {stats.loss_sum.item() / stats.seen:.6f}")
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in model.parameters()))
