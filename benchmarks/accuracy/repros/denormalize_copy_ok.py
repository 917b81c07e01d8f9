"""Correct twin: the same autoencoder's output denormalized for logging by a helper that works in place on a
``.clone()`` of the images (what torchvision's ``F.normalize`` does by default since pytorch/vision#517):
the clone is not what the tanh saved, so the loss's backward needs nothing that changed.  It looks like the
in-place bug; it is not.
EXPECT: silent
"""
import torch
from torch import nn

MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)


def denormalize_(images, mean, std):
    for c, (m, s) in enumerate(zip(mean, std)):
        channel = images[:, c]
        channel.mul_(s).add_(m)
    return images


torch.manual_seed(0)
model = nn.Sequential(nn.Flatten(), nn.Linear(48, 16), nn.ReLU(), nn.Linear(16, 48), nn.Tanh(),
                      nn.Unflatten(1, (3, 4, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    x = torch.randn(8, 3, 4, 4).clamp(-1, 1)
    recon = model(x)
    shown = denormalize_(recon.detach().clone(), MEAN, STD)
    loss = (recon - x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.6f} shown {shown.mean().item():.6f}")
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in model.parameters()))
