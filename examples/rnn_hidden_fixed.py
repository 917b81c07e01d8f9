"""RNN hidden state detached at each step: truncated backpropagation through time.

Fix of ``rnn_hidden_bug.py``: ``h = h.detach()`` at the start of each step
keeps the hidden state's value but cuts its graph, so each backward runs
through its own step only.  Seed post 000 (``hidden = hidden.detach()``).

Running it: trains for four steps, no error.  graphwatch reports nothing.
"""

import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    cell = nn.RNNCell(4, 8)
    head = nn.Linear(8, 1)
    opt = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=0.1)
    h = torch.zeros(2, 8)
    for _ in range(4):
        opt.zero_grad()
        h = h.detach()
        for _ in range(3):
            x = torch.randn(2, 4)
            h = cell(x, h)
        loss = head(h).pow(2).mean()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
