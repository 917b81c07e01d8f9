"""A GAN whose discriminator step uses ``fake`` without ``.detach()``, then the generator step reuses it.

Bug: ``d_loss`` is computed on ``D(fake)``, so ``d_loss.backward()`` runs
through the generator's graph too and frees it; the generator step then
backwards ``g_loss`` through the same ``fake`` and torch raises "Trying to
backward through the graph a second time".  Seed post 002 ("我们在训练GAN时比较
容易遇到,因为可能会有量要被反向传播训练G和D两个网络").

Running it: raises torch's RuntimeError in the first iteration (exits non-zero).
Fixed twin: ``gan_fixed.py``.
"""

import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    D = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    opt_g = torch.optim.Adam(G.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(D.parameters(), lr=1e-3)
    bce = nn.BCEWithLogitsLoss()
    ones, zeros = torch.ones(8, 1), torch.zeros(8, 1)
    for _ in range(3):
        real = torch.randn(8, 2) + 3
        fake = G(torch.randn(8, 4))  # graphwatch: carried
        opt_d.zero_grad()
        d_loss = bce(D(real), ones) + bce(D(fake), zeros)
        d_loss.backward()  # graphwatch: freeing
        opt_d.step()
        opt_g.zero_grad()
        g_loss = bce(D(fake), ones)
        g_loss.backward()  # graphwatch: backward
        opt_g.step()


if __name__ == "__main__":
    main()
