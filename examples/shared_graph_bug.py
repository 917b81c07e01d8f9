"""Two outputs of one graph backwarded one after the other: ``d.backward(); e.backward()``.

Bug: ``d = c.mean()`` and ``e = c.sum()`` share ``b = a ** 2`` and ``c = b * 2``.
``d.backward()`` frees the shared part, so ``e.backward()`` raises "Trying to
backward through the graph a second time".  Seed posts 001 and 004 (the
``a -> b -> c -> d, e`` example).

Running it: raises torch's RuntimeError in the first step (exits non-zero).
Fixed twin: ``shared_graph_fixed.py``.
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
        d.backward()  # graphwatch: freeing
        e.backward()  # graphwatch: backward
        opt.step()


if __name__ == "__main__":
    main()
