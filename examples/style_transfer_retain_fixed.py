"""Style-transfer loss modules whose losses are summed and backwarded once.

Fix of ``style_transfer_retain_bug.py``: the current PyTorch tutorial sums the
module losses and calls ``backward()`` once, which frees the graph; no
``retain_graph`` is needed.  Seed post 001.

Running it: optimises the image for four steps, no error.  graphwatch reports nothing.
"""

import torch
from torch import nn


class ContentLoss(nn.Module):
    def __init__(self, target: torch.Tensor, weight: float) -> None:
        super().__init__()
        self.target = target.detach() * weight
        self.weight = weight
        self.criterion = nn.MSELoss()

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self.loss = self.criterion(input * self.weight, self.target)
        return input


def main() -> None:
    torch.manual_seed(0)
    conv1, conv2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
    for p in [*conv1.parameters(), *conv2.parameters()]:
        p.requires_grad_(False)
    content = torch.rand(1, 3, 16, 16)
    with torch.no_grad():
        losses = [ContentLoss(conv1(content), 1.0)]
        losses.append(ContentLoss(conv2(torch.relu(conv1(content))), 0.5))
    model = nn.Sequential(conv1, losses[0], nn.ReLU(), conv2, losses[1])
    image = torch.rand(1, 3, 16, 16, requires_grad=True)
    opt = torch.optim.Adam([image], lr=0.05)
    for _ in range(4):
        opt.zero_grad()
        model(image)
        total = sum(content_loss.loss for content_loss in losses)
        total.backward()
        opt.step()


if __name__ == "__main__":
    main()
