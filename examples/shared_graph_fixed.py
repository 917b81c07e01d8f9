"""Two outputs of one graph: the first backward retains the shared part for the second.

Fix of ``shared_graph_bug.py``: ``d.backward(retain_graph=True)`` then
``e.backward()``, the last backward freeing the graph.  Seed posts 001 and 004.

Running it: runs three steps, no error.  graphwatch reports nothing.
"""

import torch


def main() -> None:
    torch.manual_seed(0)
    a = torch.rand(1, 4, requires_grad=True)
    opt = torch.optim.SGD([a], lr=0.01)
    for _ in range(3):
        b = a**2
        c = b * 2
        d = c.mean()
        e = c.sum()
        opt.zero_grad()
        d.backward(retain_graph=True)
        e.backward()
        opt.step()


if __name__ == "__main__":
    main()
