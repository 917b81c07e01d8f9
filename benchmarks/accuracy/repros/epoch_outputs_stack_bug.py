"""Reproduces: "About memory leaks" (TRI-ML/packnet-sfm issue #47, fixed by PR #51 "Detach loss before
appending it to the training output list"): a trainer keeps each step's loss in `self.outputs` for the epoch's
end, where `torch.stack(self.outputs)` averages them, so every step's graph stays alive until then.  The
later use needs tensors: `.item()` would make `torch.stack` raise on floats; `.detach()` is the fix.
EXPECT: graph-kept-alive
FIX:         self.outputs.append(loss)  # HERE =>         self.outputs.append(loss.detach())
"""
import torch
from torch import nn


class Trainer:
    def __init__(self):
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.05)
        self.outputs = []

    def training_step(self, x, y):
        loss = (self.net(x) - y).pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.outputs.append(loss)  # HERE
        return loss

    def on_epoch_end(self, epoch):
        mean = torch.stack(self.outputs).mean()
        print(f"epoch {epoch} mean loss {mean.item():.6f}")
        self.outputs.clear()


torch.manual_seed(0)
trainer = Trainer()
for epoch in range(2):
    for step in range(6):
        trainer.training_step(torch.randn(16, 8), torch.randn(16, 1))
    trainer.on_epoch_end(epoch)
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in trainer.net.parameters()))
