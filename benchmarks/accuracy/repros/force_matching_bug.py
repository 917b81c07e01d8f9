"""Reproduces: force matching for an interatomic potential, forces from torch.autograd.grad without
create_graph=True, then the energy and force losses backwarded together (issue trackers of ML potentials).
The real fix is create_graph=True: summing the backwards or retain_graph=True silences the error while the
force term trains nothing.  EXPECT: backward-through-freed-graph
FIX:     forces = -torch.autograd.grad(energy.sum(), pos)[0]  # HERE =>     forces = -torch.autograd.grad(energy.sum(), pos, create_graph=True)[0]
"""
import torch
from torch import nn

torch.manual_seed(0)
potential = nn.Sequential(nn.Linear(3, 32), nn.Tanh(), nn.Linear(32, 1))
opt = torch.optim.Adam(potential.parameters(), lr=1e-2)
for step in range(8):
    pos = torch.randn(16, 3, requires_grad=True)
    true_energy = (pos ** 2).sum(1, keepdim=True)
    true_forces = -2 * pos.detach()
    energy = potential(pos)
    forces = -torch.autograd.grad(energy.sum(), pos)[0]  # HERE
    e_loss = (energy - true_energy).pow(2).mean()
    f_loss = (forces - true_forces).pow(2).mean()
    opt.zero_grad()
    (e_loss + f_loss).backward()
    opt.step()
    print(f"step {step} energy loss {e_loss.item():.6f} force loss {f_loss.item():.6f}")
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in potential.parameters()))
