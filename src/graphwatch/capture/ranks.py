"""Which rank of a torch.distributed job this process is.

Example::

    >>> from graphwatch.capture.ranks import rank_and_world_size
    >>> rank, world_size = rank_and_world_size()
    >>> rank is None or 0 <= rank < world_size
    True
"""

from __future__ import annotations

import os

import torch


def rank_and_world_size(rank: int | None = None, world_size: int | None = None) -> tuple[int | None, int | None]:
    """This process's rank in a torch.distributed job (initialised, or launched by torchrun), else as given."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return rank, world_size
