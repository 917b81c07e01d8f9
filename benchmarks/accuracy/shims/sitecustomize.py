"""Seeds every case's process (random, numpy, torch: torch's default seed differs per process), so that a script
that seeds nothing itself (PyTorch-GAN's) prints the same numbers in every run: the own fix is compared with the
known fix by what they print."""

import random

random.seed(0)
try:
    import numpy
except ImportError:
    pass
else:
    numpy.random.seed(0)
try:
    import torch
except ImportError:
    pass
else:
    torch.manual_seed(0)
