"""Reproduces: the PyTorch tutorial's neural style transfer with the content target stored without `.detach()`
(fangdahan.medium.com, "PyTorch Style Transfer Tutorial", "Why `detach` target from graph": without it "PyTorch
will try to back propagate the graph twice" and raises "Trying to backward through the graph a second time"; the
tutorial's `ContentLoss` keeps `self.target = target.detach()`, a stated value).  The target is the feature
extractor's output on the content image, `target = model(content_img)`, kept by the loss module.
EXPECT: backward-through-freed-graph, graph-carried-across-steps
FIX:         self.target = target  # HERE =>         self.target = target.detach()
"""
import torch
from torch import nn


class ContentLoss(nn.Module):
    def __init__(self, target):
        super().__init__()
        self.target = target  # HERE

    def forward(self, x):
        self.loss = (x - self.target).pow(2).mean()
        return x


torch.manual_seed(0)
features = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))
content_img = torch.randn(4, 16)
content = ContentLoss(features(content_img))
image = content_img.clone().requires_grad_(True)
opt = torch.optim.Adam([image], lr=0.05)
for step in range(5):
    opt.zero_grad()
    content(features(image + 0.1 * torch.randn(4, 16)))
    content.loss.backward()
    opt.step()
print("trained:", f"{image.detach().sum().item():.6f}")
