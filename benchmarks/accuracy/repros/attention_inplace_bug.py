"""Reproduces: "one of the variables needed for gradient computation has been modified by an inplace
operation ... output 0 of SoftmaxBackward0": attention weights of the first query zeroed in place after the
softmax saved them (forum).  The line to name is the one that changed the tensor.  EXPECT: modified-in-place
FIX:         att[:, :, 0, :] = 0  # HERE =>         att = att.clone()\n        att[:, :, 0, :] = 0
"""
import torch
from torch import nn


class SelfAttention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5).softmax(-1)
        att[:, :, 0, :] = 0  # HERE
        return self.out((att @ v).transpose(1, 2).reshape(b, t, d))


torch.manual_seed(0)
model = SelfAttention()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    x = torch.randn(4, 8, 16)
    loss = (model(x) - x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.6f}")
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in model.parameters()))
