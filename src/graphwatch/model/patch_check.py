"""The verdict on a finding's patch, from ``graphwatch run --check-fixes``.

The check applies the patch to a copy of the script's folder and runs the
script again under graphwatch for the steps the finding needs.  A patch is
*checked* only when every condition held: it applies, the finding is gone,
the patched run raised no new error and showed no new finding, and every
parameter that received gradients before still receives them from a backward
and is stepped by the same optimizer (when the original run died early, also:
each optimizer steps and every parameter it owns gets a gradient).

Example::

    >>> check = PatchCheck(checked=False, steps=3, held=["the patch applies"],
    ...                    failed=["netG.main.0.weight got no gradient in the patched run"])
    >>> check.verdict
    'failed: netG.main.0.weight got no gradient in the patched run'
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class PatchCheck:
    """What the rerun of the patched script showed, condition by condition."""

    checked: bool  # every condition held
    steps: int = 0  # steps the patched run completed
    held: list[str] = field(default_factory=list)  # the conditions that held, one sentence each
    failed: list[str] = field(default_factory=list)  # what did not hold (or why the check could not run)
    skipped: list[str] = field(default_factory=list)  # files and folders not copied to the scratch folder
    # read from a trace file: a verdict this process did not compute, only what the trace claims (every check
    # the loader reads is marked so, whatever the file says)
    from_trace: bool = False

    @property
    def verdict(self) -> str:
        """``checked: ...`` or ``failed: ...``, one line."""
        if self.checked:
            return "checked: " + "; ".join(self.held)
        return "failed: " + "; ".join(self.failed)
