"""A tensor derived from a parameter, computed once and cached across steps.

Bug: ``xyz_perturbed`` computes ``self._xyz + noise`` (the noise scale depends
on ``self._xyz`` too) and caches the result.  The first backward frees the graph
behind the cached tensor; the second step uses the cached tensor again and
torch raises "Trying to backward through the graph a second time".  Seed post
002 (``get_xyz_purturbed`` built from ``self._xyz``; debugged with torchviz).

Running it: raises torch's RuntimeError on step 2 (exits non-zero).
Fixed twin: ``cached_param_tensor_fixed.py``.
"""

import torch
from torch import nn


class PointCloud(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self._xyz = nn.Parameter(torch.randn(32, 3))
        self._perturbed: torch.Tensor | None = None

    @property
    def xyz_perturbed(self) -> torch.Tensor:
        if self._perturbed is None:
            unc = torch.sigmoid(self._xyz.norm(dim=-1, keepdim=True))
            noise = torch.randn(32, 1) * unc
            self._perturbed = self._xyz + noise  # graphwatch: carried
        return self._perturbed


def main() -> None:
    torch.manual_seed(0)
    points = PointCloud()
    opt = torch.optim.Adam(points.parameters(), lr=0.01)
    target = torch.randn(32, 3)
    for _ in range(4):
        opt.zero_grad()
        loss = (points.xyz_perturbed - target).pow(2).mean()  # graphwatch: used
        loss.backward()  # graphwatch: backward
        opt.step()


if __name__ == "__main__":
    main()
