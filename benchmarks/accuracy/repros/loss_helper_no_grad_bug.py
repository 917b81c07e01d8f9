"""Reproduces: a loss computed in a function decorated with a no-grad decorator: "element 0 of tensors does
not require grad and does not have a grad_fn" (replicate/cog#1681: the reporter had overlooked the decorator
over the function, and removing it fixed the run).  Here the decorated helper only computes the loss, so it
has returned when the backward runs: no no-grad block is on the stack.  The line to name is the decorator
(with the helper's `def` and the call that ran it); the fix removes it.  EXPECT: loss-without-graph
FIX: @torch.no_grad()  # HERE => # (the loss needs its graph: no decorator)
"""
import torch
import torch.nn.functional as F
from torch import nn


@torch.no_grad()  # HERE
def batch_loss(model, x, y):
    return F.cross_entropy(model(x), y)


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = [(torch.randn(16, 10), torch.randint(0, 3, (16,))) for _ in range(4)]
for epoch in range(3):
    for x, y in data:
        loss = batch_loss(model, x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"epoch {epoch} loss {loss.item():.6f}")
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in model.parameters()))
