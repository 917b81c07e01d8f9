"""Reproduces: an adversarial attack (FGSM) run inside an evaluation's `with torch.no_grad():` block:
"element 0 of tensors does not require grad and does not have a grad_fn" (forum).  The block to name is the
no_grad one; the fix runs the attack under torch.enable_grad().  EXPECT: loss-without-graph
FIX:         x_adv = fgsm(model, x, y, 0.1) =>         with torch.enable_grad(): x_adv = fgsm(model, x, y, 0.1)
"""
import torch
import torch.nn.functional as F
from torch import nn


def fgsm(model, x, y, eps):
    x = x.clone().requires_grad_(True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return (x + eps * x.grad.sign()).detach()


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = [(torch.randn(16, 10), torch.randint(0, 3, (16,))) for _ in range(4)]
for epoch in range(3):
    model.train()
    for x, y in data:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    correct = 0
    with torch.no_grad():  # HERE
        for x, y in data:
            x_adv = fgsm(model, x, y, 0.1)
            correct += (model(x_adv).argmax(1) == y).sum().item()
    print(f"epoch {epoch} loss {loss.item():.6f} robust accuracy {correct / 64:.4f}")
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in model.parameters()))
