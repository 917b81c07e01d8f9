"""``vgg19`` with the layout of torchvision's (``features``: 16 3x3 convolutions, each followed by an in-place
ReLU, and 5 max-pools; ``classifier``), random weights from a fixed seed (no weights can be downloaded here),
its widths divided by ``GW_VGG_SHRINK`` (default 8: the graphs are the same, the arithmetic is 64 times less)."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

_VGG19 = [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"]


class VGG(nn.Module):
    def __init__(self, features: nn.Sequential, width: int) -> None:
        super().__init__()
        self.features = features
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(nn.Linear(width * 49, 64), nn.ReLU(True), nn.Linear(64, 1000))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def vgg19(pretrained: bool = False, weights: Any = None, **kwargs: Any) -> VGG:
    shrink = int(os.environ.get("GW_VGG_SHRINK", "8"))
    layers: list[nn.Module] = []
    channels = 3
    for item in _VGG19:
        if item == "M":
            layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
        else:
            width = max(1, int(item) // shrink)
            layers += [nn.Conv2d(channels, width, kernel_size=3, padding=1), nn.ReLU(inplace=True)]
            channels = width
    model = VGG(nn.Sequential(*layers), channels)
    generator = torch.Generator().manual_seed(0)  # the same weights in every run, the global generator untouched
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                fan_out = module.weight.shape[0] * module.weight[0, 0].numel()
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * (2.0 / fan_out) ** 0.5)
                module.bias.zero_()
    return model


class VGG19_Weights:
    DEFAULT = IMAGENET1K_V1 = "random weights (graphwatch shim)"


def __getattr__(name: str) -> Any:
    """Any other model or weights name (torchmetrics imports ``resnet50``, ``vgg16``, ``VGG16_Weights`` when it
    finds torchvision, as Lightning's imports do): there to import, an error to build."""
    if name.startswith("__"):
        raise AttributeError(name)
    return _unavailable(name)


def _unavailable(name: str) -> Any:
    def build(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"torchvision.models.{name} is not in the graphwatch shim")

    build.__name__ = name
    return build
