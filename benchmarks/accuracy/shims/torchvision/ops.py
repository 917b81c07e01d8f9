"""``torchvision.ops``: names to import (torchmetrics imports the box functions when it finds torchvision, as
Lightning's imports do), an error to call."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)

    def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"torchvision.ops.{name} is not in the graphwatch shim")

    unavailable.__name__ = name
    return unavailable
