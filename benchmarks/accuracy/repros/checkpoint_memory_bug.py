"""Reproduces: a recurrent memory carried through torch.utils.checkpoint without detach, retain_graph
added to silence the error (issue trackers of memory-augmented models).  EXPECT: graph-carried-across-steps
FIX:     out, mem = checkpoint(block, torch.randn(4, 8), mem, use_reentrant=False)  # HERE =>     mem = mem.detach()\n    out, mem = checkpoint(block, torch.randn(4, 8), mem, use_reentrant=False)
FIX: loss.backward(retain_graph=True) => loss.backward()
"""
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Linear(8, 8)

    def forward(self, x, mem):
        out = torch.tanh(self.f(x) + mem)
        return out, out.mean(0, keepdim=True)


torch.manual_seed(0)
block, head = Block(), nn.Linear(8, 1)
params = [*block.parameters(), *head.parameters()]
mem = torch.zeros(1, 8)
for step in range(6):
    out, mem = checkpoint(block, torch.randn(4, 8), mem, use_reentrant=False)  # HERE
    loss = head(out).pow(2).mean()
    for p in params:
        p.grad = None
    loss.backward(retain_graph=True)
    with torch.no_grad():
        for p in params:
            p -= 0.01 * p.grad
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in params))
