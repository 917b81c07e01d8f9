"""LSTM state carried across steps, with ``retain_graph=True`` added to silence the error: a new error.

Bug: ``h, c`` are never detached, so each step's graph hangs on the previous
one.  ``retain_graph=True`` stops "Trying to backward through the graph a
second time", but the second step's backward runs through the first step's
graph, whose saved LSTM weights ``optimizer.step()`` has since updated in
place: torch raises "one of the variables needed for gradient computation has
been modified by an inplace operation".  Seed post 000 (LSTM hidden units,
``retain_graph=True``; the fix is ``hidden.detach()``).  When the recurrence
saves no parameter the same mistake fails silently instead: see
``rnn_retain_graph_bug.py``.

Running it: raises torch's in-place RuntimeError on step 2 (exits non-zero).
Fixed twin: ``lstm_retain_graph_fixed.py``.
"""

import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    cell = nn.LSTMCell(8, 32)
    head = nn.Linear(32, 1)
    opt = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=0.01)
    h, c = torch.zeros(16, 32), torch.zeros(16, 32)
    for _ in range(4):
        opt.zero_grad()
        x = torch.randn(16, 8)
        h, c = cell(x, (h, c))  # graphwatch: carried
        loss = head(h).pow(2).mean()
        loss.backward(retain_graph=True)  # graphwatch: backward
        opt.step()


if __name__ == "__main__":
    main()
