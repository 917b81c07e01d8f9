"""A tensor derived from a parameter, recomputed in every step.

Fix of ``cached_param_tensor_bug.py``: ``xyz_perturbed`` builds
``self._xyz + noise`` anew on each access, so each step has its own graph; the
noise scale is computed from ``self._xyz.detach()`` as in seed post 002's fix
(it should not receive gradients).

Running it: trains for four steps, no error.  graphwatch reports nothing.
"""

import torch
from torch import nn


class PointCloud(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self._xyz = nn.Parameter(torch.randn(32, 3))

    @property
    def xyz_perturbed(self) -> torch.Tensor:
        unc = torch.sigmoid(self._xyz.detach().norm(dim=-1, keepdim=True))
        noise = torch.randn(32, 1) * unc
        return self._xyz + noise


def main() -> None:
    torch.manual_seed(0)
    points = PointCloud()
    opt = torch.optim.Adam(points.parameters(), lr=0.01)
    target = torch.randn(32, 3)
    for _ in range(4):
        opt.zero_grad()
        loss = (points.xyz_perturbed - target).pow(2).mean()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
