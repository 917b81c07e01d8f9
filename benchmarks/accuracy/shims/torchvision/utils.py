"""``save_image`` writes nothing (the harness looks at graphs, not pictures)."""

from __future__ import annotations

from typing import Any


def save_image(*args: Any, **kwargs: Any) -> None:
    return None


def make_grid(tensor: Any, *args: Any, **kwargs: Any) -> Any:
    return tensor
