"""Reproduces: oxwhirl/pymarl#73, "Fix memory leak": the episode runner stores the actions the agent's network
chose into the replay buffer without detaching them; each stored transition keeps its rollout's graph and CPU
memory grows linearly (the fix: detach the actions before storing).  The holder is one element of the tuples a
list keeps.  EXPECT: graph-kept-alive
FIX: buffer.append((state, action, reward, next_state))  # HERE => buffer.append((state, action.detach(), reward, next_state))
"""
import torch
from torch import nn

torch.manual_seed(0)
actor = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
opt = torch.optim.Adam(actor.parameters(), lr=1e-3)
buffer = []
state = torch.randn(4)
for step in range(10):
    action = actor(state)
    next_state, reward = torch.randn(4), torch.randn(())
    buffer.append((state, action, reward, next_state))  # HERE
    batch = buffer[-4:]
    loss = -sum(actor(s).sum() * r for s, _, r, _ in batch) / len(batch)
    opt.zero_grad()
    loss.backward()
    opt.step()
    state = next_state
    print(f"step {step} loss {loss.item():.6f}")
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in actor.parameters()))
