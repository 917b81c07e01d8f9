"""Transforms that make tensors of what they get (the fake data sets already give tensors; a PIL image, as the
neural style tutorial loads, becomes one as torchvision's ``ToTensor`` makes it)."""

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


def _is_image(x: Any) -> bool:
    return hasattr(x, "getbands")  # a PIL image


class ToTensor:
    def __call__(self, x: Any) -> torch.Tensor:
        if _is_image(x):
            import numpy as np

            return torch.from_numpy(np.asarray(x.convert("RGB"), dtype=np.float32) / 255.0).permute(2, 0, 1).contiguous()
        return torch.as_tensor(x, dtype=torch.float32)


class ToPILImage:
    def __call__(self, x: torch.Tensor) -> Any:
        from PIL import Image

        array = (x.detach().clamp(0, 1) * 255).byte().permute(1, 2, 0).numpy()
        return Image.fromarray(array)


class Normalize:
    def __init__(self, mean: Any, std: Any) -> None:
        self.mean, self.std = torch.tensor(mean).view(-1, 1, 1), torch.tensor(std).view(-1, 1, 1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean[: x.shape[0]]) / self.std[: x.shape[0]]


class Resize:
    def __init__(self, size: Any) -> None:
        self.size = (size, size) if isinstance(size, int) else tuple(size)

    def __call__(self, x: Any) -> Any:
        if _is_image(x):
            return x.resize(self.size[::-1])  # (PIL takes width, height)
        return F.interpolate(x.unsqueeze(0), size=self.size, mode="bilinear", align_corners=False).squeeze(0)


class CenterCrop:
    def __init__(self, size: Any) -> None:
        self.size = size

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x
