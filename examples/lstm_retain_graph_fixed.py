"""LSTM trained with truncated BPTT: the state is detached each step, no ``retain_graph``.

Fix of ``lstm_retain_graph_bug.py``: ``h, c = h.detach(), c.detach()`` cuts the
graph between steps, so ``retain_graph=True`` is no longer needed and each
backward frees its own step's graph.  Seed post 000.

Running it: trains for four steps, no error.  graphwatch reports nothing.
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
        h, c = h.detach(), c.detach()
        x = torch.randn(16, 8)
        h, c = cell(x, (h, c))
        loss = head(h).pow(2).mean()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
