"""Reproduces: the memory-leak warning of runebook.dev's guide to `torch.nn.Module.register_forward_hook`
(https://runebook.dev/ja/docs/pytorch/generated/torch.nn.module/torch.nn.Module.register_forward_hook): a forward
hook that appends each output to a list keeps, while training, every step's graph through the tensors it stored
(the fix: append `output.detach()`).  The list lives only in the hook's closure.  EXPECT: graph-kept-alive
FIX: activations.append(output)  # HERE => activations.append(output.detach())
"""
import torch
from torch import nn


def record_activations(layer):
    activations = []

    def hook(module, inputs, output):
        activations.append(output)  # HERE

    layer.register_forward_hook(hook)


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
record_activations(model[1])
for step in range(10):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.6f}")
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in model.parameters()))
