"""RNN hidden state never detached: the second step backwards into the first step's freed graph.

Bug: ``h = cell(x, h)`` keeps the previous chunk's graph attached to ``h``.  The
first ``loss.backward()`` frees that graph; the second step's backward runs
through ``h`` into it and torch raises "Trying to backward through the graph a
second time".  Seed post 000 (LSTM/GRU hidden units; fixed by ``hidden.detach()``).

Running it: raises torch's RuntimeError on step 2 (exits non-zero).
Fixed twin: ``rnn_hidden_fixed.py``.
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
        for _ in range(3):
            x = torch.randn(2, 4)
            h = cell(x, h)  # graphwatch: carried
        loss = head(h).pow(2).mean()
        loss.backward()  # graphwatch: backward
        opt.step()


if __name__ == "__main__":
    main()
