"""A stand-in for torchvision, for the accuracy harness only: there is no CPU torchvision wheel here, and
no data set can be downloaded.  Data sets yield seeded random images of the asked size; transforms turn
what they get into tensors; ``models.vgg19`` has random weights; ``save_image`` writes nothing.  The training scripts run unchanged on it."""

from . import datasets, models, transforms, utils

__all__ = ["datasets", "models", "transforms", "utils"]
__version__ = "0.0-graphwatch-shim"
