"""A recurrent state detached at each step (truncated BPTT), no ``retain_graph``.

Fix of ``rnn_retain_graph_bug.py``: ``h = h.detach()`` keeps the state's value
and cuts its graph, so ``retain_graph=True`` is not needed and each backward
frees its own step's graph.  Seed post 000.

Running it: trains for eight steps, no error.  graphwatch reports nothing.
"""

import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    encoder = nn.Linear(8, 64)
    head = nn.Linear(64, 1)
    opt = torch.optim.SGD([*encoder.parameters(), *head.parameters()], lr=0.01)
    h = torch.zeros(32, 64)
    for _ in range(8):
        opt.zero_grad()
        h = h.detach()
        x = torch.randn(32, 8)
        h = 0.5 * h + torch.tanh(encoder(x))
        loss = head(h).pow(2).mean()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
