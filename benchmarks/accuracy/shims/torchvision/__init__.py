"""A stand-in for torchvision, for the accuracy harness only: there is no CPU torchvision wheel here, and
no data set can be downloaded.  Data sets yield seeded random images of the asked size; transforms turn
what they get into tensors; ``save_image`` writes nothing.  The training scripts run unchanged on it."""

from . import datasets, transforms, utils

__all__ = ["datasets", "transforms", "utils"]
__version__ = "0.0-graphwatch-shim"
