"""A GAN trained the standard way: the discriminator step uses ``fake.detach()``.

Fix of ``gan_bug.py``: ``D(fake.detach())`` keeps the discriminator's backward
out of the generator's graph, so the generator step can backward through
``fake`` once, freeing it.  (The DCGAN recipe; seed post 002.)

Running it: trains three iterations, no error.  graphwatch reports nothing.
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
        fake = G(torch.randn(8, 4))
        opt_d.zero_grad()
        d_loss = bce(D(real), ones) + bce(D(fake.detach()), zeros)
        d_loss.backward()
        opt_d.step()
        opt_g.zero_grad()
        g_loss = bce(D(fake), ones)
        g_loss.backward()
        opt_g.step()


if __name__ == "__main__":
    main()
