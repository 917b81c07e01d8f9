"""Backward twice through one graph on purpose: the first backward retains it.

Fix of ``backward_twice_bug.py``: ``y.backward(retain_graph=True)`` keeps the
saved tensors for the second ``y.backward()``, which (being the last) frees them;
the gradients add up (``w.grad`` is twice the single-backward value).  Seed post
003's first snippet.

Running it: runs three steps, no error.  graphwatch reports nothing.
"""

import torch


def main() -> None:
    torch.manual_seed(0)
    w = torch.tensor([1.0], requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.01)
    for _ in range(3):
        x = torch.randn(1)
        a = torch.add(w, x)
        b = torch.add(w, 1)
        y = torch.mul(a, b)
        opt.zero_grad()
        y.backward(retain_graph=True)
        y.backward()
        opt.step()


if __name__ == "__main__":
    main()
