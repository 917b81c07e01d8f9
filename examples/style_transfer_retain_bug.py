"""Style-transfer loss modules that each call ``self.loss.backward(retain_graph=True)``.

Bug: the old neural-transfer tutorial's ``ContentLoss.backward`` retains the
graph on every call, the last one included, so the step's saved tensors
outlive the step for nothing.  Seed post 001 ("#Why is retain_variables True??";
answer: only a backward followed by another through the same graph needs it).

Running it: runs to the end; the bug is silent (graphwatch reports it).
Fixed twin: ``style_transfer_retain_fixed.py``.
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
        self.output = input
        return self.output

    def backward(self, retain_graph: bool = True) -> torch.Tensor:
        self.loss.backward(retain_graph=retain_graph)  # graphwatch: retained
        return self.loss


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
        score = 0.0
        for content_loss in losses:
            score += content_loss.backward().item()
        opt.step()


if __name__ == "__main__":
    main()
