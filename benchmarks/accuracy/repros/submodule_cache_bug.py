"""Reproduces: a key cache kept on the attention submodule across training steps, grown by the outer model's
`forward` (graphwatch issue 39: a model's KV cache kept on `self.attn.cache_k` got `self.cache_k =
self.cache_k.detach()` placed in the outer `forward`, whose `self` has no `cache_k`; caches kept on attention
modules as in rasbt/LLMs-from-scratch pull request #673, "Optimize KV cache").  The cache is meant to carry
over; its graph is not.  EXPECT: backward-through-freed-graph, graph-carried-across-steps
FIX:         self.attn.cache_k = torch.cat([self.attn.cache_k, k])  # HERE =>         self.attn.cache_k = torch.cat([self.attn.cache_k.detach(), k])
"""
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.query, self.key = nn.Linear(width, width), nn.Linear(width, width)
        self.cache_k = torch.zeros(0, width)


class Model(nn.Module):
    def __init__(self, width=8):
        super().__init__()
        self.attn, self.head = Attention(width), nn.Linear(width, 1)

    def forward(self, x):
        k = self.attn.key(x)
        self.attn.cache_k = torch.cat([self.attn.cache_k, k])  # HERE
        weights = (self.attn.query(x) @ self.attn.cache_k.T).softmax(-1)
        return self.head(weights @ self.attn.cache_k)


torch.manual_seed(0)
model = Model()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    x = torch.randn(3, 8)
    opt.zero_grad()
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in model.parameters()))
