"""Reproduces: a loss computed from hard predictions, the softmax's `argmax(dim=1)` cast back to float, next
to an accuracy made from the same predictions: "element 0 of tensors does not require grad and does not have
a grad_fn" (the training loop diagnosed at https://php.bkmy88.com/faq/1835025.html; the fix there gives the
loss the logits, with cross-entropy).  The line to name is the argmax one.  EXPECT: loss-without-graph
FIX:         loss = loss_fn(preds, y.float()) =>         loss = F.cross_entropy(logits, y)
"""
import torch
import torch.nn.functional as F  # noqa: F401  (the FIX line uses it)
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = nn.MSELoss()
data = [(torch.randn(16, 10), torch.randint(0, 3, (16,))) for _ in range(4)]
for epoch in range(3):
    correct = 0
    for x, y in data:
        logits = model(x)
        preds = torch.softmax(logits, dim=1).argmax(dim=1).type(torch.float32)  # HERE
        loss = loss_fn(preds, y.float())
        correct += (preds == y.float()).sum().item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"epoch {epoch} loss {loss.item():.6f} accuracy {correct / 64:.4f}")
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in model.parameters()))
