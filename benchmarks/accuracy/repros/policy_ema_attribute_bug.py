"""Reproduces: a policy-gradient agent that keeps a moving average of its loss as an attribute for logging,
`self.loss_ema = 0.95 * self.loss_ema + 0.05 * loss`: every step's graph stays reachable from the agent
(issue trackers of RL codebases).  The holder is an attribute of an object.  EXPECT: graph-kept-alive
FIX:         self.loss_ema = 0.95 * self.loss_ema + 0.05 * loss  # HERE =>         self.loss_ema = 0.95 * self.loss_ema + 0.05 * loss.detach()
"""
import torch
from torch import nn


class Agent:
    def __init__(self):
        self.policy = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2))
        self.opt = torch.optim.Adam(self.policy.parameters(), lr=1e-2)
        self.loss_ema = torch.zeros(())

    def update(self, states, actions, returns):
        logp = torch.log_softmax(self.policy(states), 1).gather(1, actions[:, None]).squeeze(1)
        loss = -(logp * returns).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.loss_ema = 0.95 * self.loss_ema + 0.05 * loss  # HERE
        return loss.item()


torch.manual_seed(0)
agent = Agent()
for episode in range(10):
    states, actions, returns = torch.randn(16, 4), torch.randint(0, 2, (16,)), torch.randn(16)
    loss = agent.update(states, actions, returns)
    print(f"episode {episode} loss {loss:.6f} ema {agent.loss_ema.item():.6f}")
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in agent.policy.parameters()))
