"""Correct: WGAN-GP with n_critic = 5; g_loss is reassigned once per generator step and kept between.
EXPECT: silent"""
import torch
from torch import nn

torch.manual_seed(0)
G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
D = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
optD, optG = torch.optim.Adam(D.parameters(), 1e-3), torch.optim.Adam(G.parameters(), 1e-3)
for i in range(30):
    real = torch.randn(16, 2)
    fake = G(torch.randn(16, 4))
    optD.zero_grad()
    alpha = torch.rand(16, 1)
    mix = (alpha * real + (1 - alpha) * fake.detach()).requires_grad_(True)
    grad, = torch.autograd.grad(D(mix).sum(), mix, create_graph=True)
    d_loss = -D(real).mean() + D(fake.detach()).mean() + 10 * (grad.norm(2, dim=1) - 1).pow(2).mean()
    d_loss.backward()
    optD.step()
    optG.zero_grad()
    if i % 5 == 0:
        g_loss = -D(G(torch.randn(16, 4))).mean()
        g_loss.backward()
        optG.step()
    print(f"{i} d {d_loss.item():.3f} g {g_loss.item():.3f}")
