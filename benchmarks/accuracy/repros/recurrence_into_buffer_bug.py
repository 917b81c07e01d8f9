"""Reproduces: a hand-written recurrence that writes each new state into one preallocated tensor,
``h[:, t + 1] = f(h[:, t])``: each write changes the slice the step before saved, "modified by an inplace
operation ... output 0 of AsStridedBackward0" (pytorch/pytorch#165621, the nn.RNN docstring's example; its fix,
pytorch/pytorch#173888, keeps the states in a list and stacks them: cloning the tensor first did not help).
EXPECT: modified-in-place
FIX:     h = x.new_zeros(4, 6, 8) =>     states = [x]
FIX:     h[:, 0] = x =>     # (the first state is the list's first)
FIX:         h[:, t + 1] = torch.tanh(cell(h[:, t]))  # HERE =>         states.append(torch.tanh(cell(states[t])))
FIX:     loss = head(h).pow(2).mean() =>     h = torch.stack(states, 1)\n    loss = head(h).pow(2).mean()
"""
import torch
from torch import nn

torch.manual_seed(0)
cell, head = nn.Linear(8, 8), nn.Linear(8, 1)
opt = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=0.1)
for step in range(6):
    x = torch.randn(4, 8)
    h = x.new_zeros(4, 6, 8)
    h[:, 0] = x
    for t in range(5):
        h[:, t + 1] = torch.tanh(cell(h[:, t]))  # HERE
    loss = head(h).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.6f}")
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in [*cell.parameters(), *head.parameters()]))
