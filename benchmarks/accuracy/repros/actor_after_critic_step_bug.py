"""Reproduces: an actor-critic update (DDPG-style) whose actor loss goes through the critic's forward made
before the critic's ``optimizer.step()``, and is backwarded after it: "modified by an inplace operation ...
output 0 of AsStridedBackward0" (cross32768/Dreamer_PyTorch#2: the value model's step before the action
loss's backward; reordering the backward before that step fixed it).  The actor's backward is moved before the
critic's step, each optimizer zeroing its gradients just before its own loss's backward.
EXPECT: modified-in-place
FIX:     actor_loss.backward() =>     # (the actor's backward runs before the critic's step, above)
FIX:     actor_opt.zero_grad() =>     # (the actor's gradients are zeroed above)
FIX:     critic_opt.zero_grad() =>     actor_opt.zero_grad()\n    actor_loss.backward()\n    critic_opt.zero_grad()
"""
import torch
from torch import nn

torch.manual_seed(0)
actor = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2), nn.Tanh())
critic = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
actor_opt = torch.optim.Adam(actor.parameters(), lr=1e-3)
critic_opt = torch.optim.Adam(critic.parameters(), lr=1e-3)
for step in range(6):
    states, actions, returns = torch.randn(32, 4), torch.rand(32, 2) * 2 - 1, torch.randn(32, 1)
    critic_loss = (critic(torch.cat([states, actions], 1)) - returns).pow(2).mean()
    actor_loss = -critic(torch.cat([states, actor(states)], 1)).mean()
    critic_opt.zero_grad()
    critic_loss.backward()
    critic_opt.step()  # HERE
    actor_opt.zero_grad()
    actor_loss.backward()
    actor_opt.step()
    print(f"step {step} critic {critic_loss.item():.6f} actor {actor_loss.item():.6f}")
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in [*actor.parameters(), *critic.parameters()]))
