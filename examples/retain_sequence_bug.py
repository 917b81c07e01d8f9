"""Backwards retaining the graph, then one that frees it, then one more: the last one fails.

Bug: ``retain_graph=True`` lets you backward any number of times, but the first
backward without it frees the graph; any backward after that raises "Trying to
backward through the graph a second time".  Seed post 004::

    d.backward(retain_graph=True) # fine
    e.backward(retain_graph=True) # fine
    d.backward() # also fine
    e.backward() # error will occur!

Running it: raises torch's RuntimeError in the first step (exits non-zero).
Fixed twin: ``retain_sequence_fixed.py``.
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
        d.backward()  # graphwatch: freeing
        e.backward()  # graphwatch: backward
        a.grad = None


if __name__ == "__main__":
    main()
