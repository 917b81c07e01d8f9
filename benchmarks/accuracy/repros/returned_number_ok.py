"""Correct: the char-RNN tutorial as published, its `train()` returning `output, loss.item()` (a number the
caller adds to `current_loss`): no graph outlives its step (the twin of returned_loss_bug.py).  EXPECT: silent
"""
import torch
from torch import nn

torch.manual_seed(0)
rnn = nn.RNN(8, 16)
head = nn.Linear(16, 4)
criterion = nn.CrossEntropyLoss()
learning_rate = 0.05


def train(category_tensor, line_tensor):
    rnn.zero_grad()
    head.zero_grad()
    out, _ = rnn(line_tensor)
    output = head(out[-1])
    loss = criterion(output, category_tensor)
    loss.backward()
    for p in [*rnn.parameters(), *head.parameters()]:
        p.data.add_(p.grad.data, alpha=-learning_rate)
    return output, loss.item()


current_loss = 0
all_losses = []
for it in range(1, 13):
    output, loss = train(torch.tensor([it % 4]), torch.randn(5, 1, 8))
    current_loss += loss
    if it % 4 == 0:
        print("%d %.4f" % (it, loss))  # noqa: UP031 (as the tutorial prints)
        all_losses.append(current_loss / 4)
        current_loss = 0
print("losses:", " ".join(f"{v:.6f}" for v in all_losses))
print("trained:", " ".join(f"{p.detach().sum().item():.6f}" for p in rnn.parameters()))
