"""Seeded random stand-ins for the data sets training scripts ask for (``GW_FAKE_LEN`` items each)."""

from __future__ import annotations

import os
from typing import Any, Callable

import torch


class _Fake(torch.utils.data.Dataset):
    shape = (3, 32, 32)

    def __init__(self, *args: Any, transform: Callable[[Any], Any] | None = None, **kwargs: Any) -> None:
        self.transform = transform
        self.length = int(os.environ.get("GW_FAKE_LEN", "256"))

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[Any, int]:
        generator = torch.Generator().manual_seed(index)
        image = torch.rand(self.shape, generator=generator)
        if self.transform is not None:
            image = self.transform(image)
        return image, index % 10


class MNIST(_Fake):
    shape = (1, 28, 28)


FashionMNIST = MNIST


class CIFAR10(_Fake):
    shape = (3, 32, 32)


class ImageFolder(_Fake):
    shape = (3, 64, 64)


LSUN = ImageFolder


class FakeData(_Fake):
    """torchvision's FakeData: ``image_size`` (C, H, W) images of ``size`` items (GW_FAKE_LEN when set)."""

    def __init__(self, size: int = 1000, image_size: tuple[int, int, int] = (3, 224, 224), *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.length = int(os.environ.get("GW_FAKE_LEN", size))
        self.shape = tuple(image_size)
