"""Correct twin of replay_tuple_bug.py: the transitions are stored with the action detached, as the fix of
oxwhirl/pymarl#73 does; the tuples a list keeps hold no graph.  EXPECT: silent
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
    buffer.append((state, action.detach(), reward, next_state))
    batch = buffer[-4:]
    loss = -sum(actor(s).sum() * r for s, _, r, _ in batch) / len(batch)
    opt.zero_grad()
    loss.backward()
    opt.step()
    state = next_state
    print(f"step {step} loss {loss.item():.6f}")
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in actor.parameters()))
