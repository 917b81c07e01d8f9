"""Reproduces: neural style transfer, "backward through the graph a second time" when the target gram
matrix is stored without .detach() (forum).  EXPECT: backward-through-freed-graph, graph-carried-across-steps
FIX: self.target = gram_matrix(target_feature)  # HERE => self.target = gram_matrix(target_feature).detach()
"""
import torch
from torch import nn


def gram_matrix(x):
    features = x.view(x.size(0), -1)
    return features @ features.t() / features.numel()


class StyleLoss(nn.Module):
    def __init__(self, target_feature):
        super().__init__()
        self.target = gram_matrix(target_feature)  # HERE

    def forward(self, x):
        self.loss = (gram_matrix(x) - self.target).pow(2).sum()
        return x


torch.manual_seed(0)
features = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))
style = StyleLoss(features(torch.randn(4, 16)))
image = torch.randn(4, 16, requires_grad=True)
opt = torch.optim.Adam([image], lr=0.05)
for step in range(5):
    opt.zero_grad()
    style(features(image))
    style.loss.backward()
    opt.step()
print("trained:", f"{image.detach().sum().item():.6f}")
