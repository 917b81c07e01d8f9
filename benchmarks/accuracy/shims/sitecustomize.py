"""Seeds every program the accuracy harness runs (``random``, NumPy, torch) before it starts.

Some third-party scripts seed nothing (PyTorch-GAN's draw their noise from NumPy and shuffle with torch), and a
fix is judged by comparing what two runs print: unseeded, two runs of the same program differ.  A script that
seeds itself (pytorch/examples' ``--seed``) overrides this.  Only where the harness asks for it
(``GW_ACCURACY_SEED``); Python imports this module at start-up because the harness puts ``shims`` on
``PYTHONPATH``.
"""

import os

_SEED = os.environ.get("GW_ACCURACY_SEED")
if _SEED is not None:
    import random

    random.seed(int(_SEED))
    try:
        import numpy

        numpy.random.seed(int(_SEED))
    except ImportError:
        pass
    import torch

    torch.manual_seed(int(_SEED))
