"""Reproduces PyTorch's char-RNN classification tutorial with its `train()` returning the loss tensor instead
of a number (the leak reported by "Fix the memory leak when calling line search sd for training Lyapunov",
StanfordASL/neural-network-lyapunov PR #140: "losses list only stores the float value, not the tensor"): the
caller adds it to `current_loss` and appends averages to `all_losses`, so every step's graph stays alive.
The fix goes where the graph leaves `train()`.  EXPECT: graph-kept-alive
FIX:     return output, loss  # HERE =>     return output, loss.item()
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
    return output, loss  # HERE


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
