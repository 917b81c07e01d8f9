"""A stand-in for torchvision, for the accuracy harness only: there is no CPU torchvision wheel here, and
no data set can be downloaded.  Data sets yield seeded random images of the asked size; transforms turn
what they get into tensors; ``models.vgg19`` has random weights; ``save_image`` writes nothing; other models
and ``ops`` are names to import (torchmetrics imports some when it finds torchvision), an error to call.  The
training scripts run unchanged on it."""

from . import datasets, models, ops, transforms, utils

__all__ = ["datasets", "models", "ops", "transforms", "utils"]
__version__ = "0.0-graphwatch-shim"
