"""Truncated BPTT over a long sequence with an LSTM module, detaching in place between chunks (correct).

The sequence is cut into chunks; the hidden state flows from chunk to chunk as
a value, and ``hidden.detach_()``-style cutting (here ``h.detach_(); c.detach_()``)
ends each chunk's graph.  Seed post 000 lists the three ways to cut:
``hidden.detach_()``, ``hidden = hidden.detach()``, ``Variable(hidden.data, requires_grad=True)``.

Running it: trains on five chunks, no error.  graphwatch reports nothing.
"""

import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    lstm = nn.LSTM(4, 16, batch_first=True)
    head = nn.Linear(16, 1)
    opt = torch.optim.Adam([*lstm.parameters(), *head.parameters()], lr=1e-3)
    sequence, targets = torch.randn(2, 50, 4), torch.randn(2, 50, 1)
    h, c = torch.zeros(1, 2, 16), torch.zeros(1, 2, 16)
    for start in range(0, 50, 10):
        h.detach_()
        c.detach_()
        out, (h, c) = lstm(sequence[:, start : start + 10], (h, c))
        loss = (head(out) - targets[:, start : start + 10]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
