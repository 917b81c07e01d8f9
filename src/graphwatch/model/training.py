"""What trained: each optimizer that stepped, and per parameter it owns whether a backward gave it a gradient.

``graphwatch run`` records these (:mod:`graphwatch.capture.causes.parameters`) so that
a patched run can be compared with the original one (``--check-fixes``): every
parameter that received gradients before must still receive them and be
stepped by the same optimizer.  A parameter is identified across two runs by
its optimizer's index, its group, its index in the group and its shape, and by
its name where the user's frames name it (``netD.main.0.weight``).  A
session also tells from them which parameters an optimizer steps but never
trains (:mod:`graphwatch.analysis.untrained`): those that required a gradient
and held none at every one of its steps.

Example::

    >>> from graphwatch.model.training import OptimizerRecord, ParameterRecord
    >>> adam = OptimizerRecord(index=1, kind="Adam", name="optimizerG", first_step=0, steps=3)
    >>> p = ParameterRecord(optimizer=1, group=0, index=2, shape=(8, 4), name="netG.main.0.weight")
    >>> adam.label, p.label, p.key, p.trained, p.starved
    ('optimizerG (Adam)', 'netG.main.0.weight', (1, 0, 2, (8, 4)), False, False)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class OptimizerRecord:
    """An optimizer of the run: its index (the order in which optimizers first stepped; those found at the
    end that never stepped come last), its class and the variable that holds it."""

    index: int
    kind: str  # its class: "Adam"
    name: str = ""  # the variable that holds it, where the user's frames name it: "optimizerD"
    first_step: int | None = None  # the step of its first .step(); None: it never stepped
    steps: int = 0  # how many times .step() ran
    site: int | None = None  # the call site (Trace.sites) of its first .step(), where the session knows it
    # where parameters it stepped without a gradient were cut off from the loss backwarded before that step, where
    # found (capture/causes/parameter_cuts.py): the statement, its op ("`.detach()`", "`.data`",
    # "`torch.no_grad()`"), the expression cut ("G(z)"), and the ``with torch.no_grad():`` line
    cut_at: int | None = None
    cut_op: str = ""
    cut_what: str = ""
    cut_block_at: int | None = None

    @property
    def label(self) -> str:
        return f"{self.name} ({self.kind})" if self.name else f"optimizer {self.index} ({self.kind})"


@dataclass(slots=True)
class ParameterRecord:
    """One parameter of one optimizer: the first step in which that optimizer stepped it holding a gradient, and
    the steps it held none while it required one."""

    optimizer: int  # OptimizerRecord.index
    group: int
    index: int  # in its param group
    shape: tuple[int, ...] = ()
    name: str = ""  # as the user's frames name it ("model.0.weight", "log_alpha"), where they do
    first_grad_step: int | None = None  # None: never held a (non-zero) gradient when its optimizer stepped
    first_held_step: int | None = None  # the first step its optimizer stepped it holding any gradient (zeros too)
    bare_steps: int = 0  # its optimizer's steps before that at which it required a gradient and held none
    # of those, the steps after a backward that reached it (seen where the session walked the graph): something
    # between that backward and the step reset its gradient (a `zero_grad()` called after the backward)
    reset_steps: int = 0

    @property
    def key(self) -> tuple[int, int, int, tuple[int, ...]]:
        """Its identity in a run without names: optimizer, group, index and shape."""
        return (self.optimizer, self.group, self.index, tuple(self.shape))

    @property
    def label(self) -> str:
        size = "x".join(map(str, self.shape)) or "scalar"
        return self.name or f"parameter {self.index} of group {self.group} ({size})"

    @property
    def trained(self) -> bool:
        return self.first_grad_step is not None

    @property
    def starved(self) -> bool:
        """Stepped while it required a gradient, and never held one: no backward ever reached it."""
        return self.first_held_step is None and self.bare_steps > 0
