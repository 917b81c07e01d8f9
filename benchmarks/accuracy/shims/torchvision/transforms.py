"""Transforms that make tensors of what they get (the fake data sets already give tensors)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


class Compose:
    def __init__(self, transforms: list[Any]) -> None:
        self.transforms = transforms

    def __call__(self, x: Any) -> Any:
        for transform in self.transforms:
            x = transform(x)
        return x


class ToTensor:
    def __call__(self, x: Any) -> torch.Tensor:
        return torch.as_tensor(x, dtype=torch.float32)


class Normalize:
    def __init__(self, mean: Any, std: Any) -> None:
        self.mean, self.std = torch.tensor(mean).view(-1, 1, 1), torch.tensor(std).view(-1, 1, 1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean[: x.shape[0]]) / self.std[: x.shape[0]]


class Resize:
    def __init__(self, size: Any) -> None:
        self.size = (size, size) if isinstance(size, int) else tuple(size)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x.unsqueeze(0), size=self.size, mode="bilinear", align_corners=False).squeeze(0)


class CenterCrop:
    def __init__(self, size: Any) -> None:
        self.size = size

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x
