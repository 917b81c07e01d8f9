"""Several backwards through one graph: every one retains it except the last.

Fix of ``retain_sequence_bug.py``: ``retain_graph=True`` on each backward but
the last, which frees the graph.  Seed post 004.

Running it: runs two steps, no error.  graphwatch reports nothing.
"""

import torch


def main() -> None:
    torch.manual_seed(0)
    a = torch.rand(1, 4, requires_grad=True)
    for _ in range(2):
        b = a**2
        c = b * 2
        d = c.mean()
        e = c.sum()
        d.backward(retain_graph=True)
        e.backward(retain_graph=True)
        d.backward(retain_graph=True)
        e.backward()
        a.grad = None


if __name__ == "__main__":
    main()
