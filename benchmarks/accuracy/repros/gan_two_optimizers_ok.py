"""Correct: the DCGAN loop (D on real, D on fake.detach(), D step, G step) with errD_real/errD kept in
variables reassigned every iteration.  EXPECT: silent"""
import torch
from torch import nn

torch.manual_seed(0)
G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
D = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
optD, optG = torch.optim.Adam(D.parameters(), 1e-3), torch.optim.Adam(G.parameters(), 1e-3)
criterion = nn.BCEWithLogitsLoss()
for i in range(10):
    D.zero_grad()
    errD_real = criterion(D(torch.randn(16, 2)), torch.ones(16, 1))
    errD_real.backward()
    fake = G(torch.randn(16, 4))
    errD_fake = criterion(D(fake.detach()), torch.zeros(16, 1))
    errD_fake.backward()
    errD = errD_real + errD_fake
    optD.step()
    G.zero_grad()
    errG = criterion(D(fake), torch.ones(16, 1))
    errG.backward()
    optG.step()
