"""Reproduces: a conservative critic with a Lagrange multiplier whose constraint term is written once, from the
named multiplier `alpha`, and used by both losses (ray-project/ray issue 16770, RLlib CQL with
`lagrangian=True`: "Trying to backward through the graph a second time").  Both detaches in the shared term
(issue 39) leave the multiplier's loss without a graph; each loss needs its own copy of the term, the critic's
with the multiplier detached, the multiplier's with the constraint detached (ray-project/ray pull request
62755).  The twin of lagrange_shared_term_bug.py where every value to detach has a name: graphwatch's patch
writes the two copies.  EXPECT: backward-through-freed-graph
FIX:     critic_loss = td_loss + min_q_loss =>     critic_loss = td_loss + alpha.detach() * (gap - 1.0)
FIX:     alpha_loss = -min_q_loss =>     alpha_loss = -alpha * (gap.detach() - 1.0)
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
    alpha = log_alpha.exp()
    min_q_loss = alpha * (gap - 1.0)  # HERE
    critic_loss = td_loss + min_q_loss
    critic_opt.zero_grad()
    critic_loss.backward()
    critic_opt.step()
    alpha_loss = -min_q_loss
    alpha_opt.zero_grad()
    alpha_loss.backward()
    alpha_opt.step()
    print(f"step {step} critic {critic_loss.item():.6f} alpha {log_alpha.exp().item():.6f}")
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in [*critic.parameters(), log_alpha]))
