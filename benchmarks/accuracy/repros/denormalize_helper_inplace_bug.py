"""Reproduces: "one of the variables needed for gradient computation has been modified by an inplace
operation ... output 0 of TanhBackward0": an autoencoder's output images are denormalized for logging by a
helper that works in place channel by channel (``t.mul_(s).add_(m)``, as torchvision's ``F.normalize`` did:
pytorch/vision#517, "Normalize() transform has undocumented side effect"), before the loss's backward needs
the tanh's saved output.  The line to name is the helper's write, reached from the loop's call.
EXPECT: modified-in-place
FIX:     denormalize_(recon, MEAN, STD) =>     denormalize_(recon.clone(), MEAN, STD)
"""
import torch
from torch import nn

MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)


def denormalize_(images, mean, std):
    for c, (m, s) in enumerate(zip(mean, std)):
        channel = images[:, c]
        channel.mul_(s).add_(m)  # HERE
    return images


torch.manual_seed(0)
model = nn.Sequential(nn.Flatten(), nn.Linear(48, 16), nn.ReLU(), nn.Linear(16, 48), nn.Tanh(),
                      nn.Unflatten(1, (3, 4, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    x = torch.randn(8, 3, 4, 4).clamp(-1, 1)
    recon = model(x)
    denormalize_(recon, MEAN, STD)
    loss = (recon - x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.6f}")
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in model.parameters()))
