"""Reproduces: an offline-RL critic with a Lagrange multiplier (CQL-style), two optimizers; the multiplier's
loss is built from the critic's gap, which is not detached, so its backward runs into the critic's freed graph
(issue trackers of offline-RL libraries).  The real fix detaches twice: the multiplier in the critic's loss and
the gap in the multiplier's loss.  EXPECT: backward-through-freed-graph
FIX:     critic_loss = td_loss + log_alpha.exp() * (gap - 1.0) =>     critic_loss = td_loss + log_alpha.exp().detach() * (gap - 1.0)
FIX:     alpha_loss = -log_alpha.exp() * (gap - 1.0)  # HERE =>     alpha_loss = -log_alpha.exp() * (gap.detach() - 1.0)
"""
import torch
from torch import nn

torch.manual_seed(0)
critic = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))
log_alpha = torch.zeros((), requires_grad=True)
critic_opt = torch.optim.Adam(critic.parameters(), lr=1e-3)
alpha_opt = torch.optim.Adam([log_alpha], lr=1e-2)
for step in range(8):
    states, actions = torch.randn(32, 4), torch.randn(32, 2)
    random_actions = torch.rand(32, 10, 2) * 2 - 1
    q_data = critic(torch.cat([states, actions], 1))
    q_random = critic(torch.cat([states.unsqueeze(1).expand(-1, 10, -1), random_actions], 2)).squeeze(2)
    gap = (torch.logsumexp(q_random, 1, keepdim=True) - q_data).mean()
    td_loss = (q_data - torch.randn(32, 1)).pow(2).mean()
    critic_loss = td_loss + log_alpha.exp() * (gap - 1.0)
    critic_opt.zero_grad()
    critic_loss.backward()
    critic_opt.step()
    alpha_loss = -log_alpha.exp() * (gap - 1.0)  # HERE
    alpha_opt.zero_grad()
    alpha_loss.backward()
    alpha_opt.step()
    print(f"step {step} critic {critic_loss.item():.6f} alpha {log_alpha.exp().item():.6f}")
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in [*critic.parameters(), log_alpha]))
