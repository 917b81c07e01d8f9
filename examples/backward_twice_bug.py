"""The same loss backwarded twice in one step: the first backward freed the graph.

Bug: ``y.backward()`` frees the saved tensors of ``y``'s graph; the second
``y.backward()`` needs them and torch raises "Trying to backward through the
graph a second time".  Seed post 003 (``y = torch.mul(a, b)``, ``y.backward()``
twice) and seed post 002's routine check ("在一个iter中多次反向传播").

Running it: raises torch's RuntimeError in the first step (exits non-zero).
Fixed twin: ``backward_twice_fixed.py``.
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
        y.backward()  # graphwatch: freeing
        y.backward()  # graphwatch: backward
        opt.step()


if __name__ == "__main__":
    main()
