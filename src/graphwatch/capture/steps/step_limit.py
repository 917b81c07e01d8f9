"""Stopping a watched run cleanly at a step boundary (``graphwatch run --stop-after N``).

A session given a step limit raises :class:`StepLimitReached` right after it
closes its N-th step: from the optimizer's post-step hook (the parameters were
already updated), or, for a step that a backward ended, from the first forward
op of the next step (the rest of the loop's pass ran: a manual update, a
print).  Everything up to the end of step N runs as it would without the
limit.  The exception derives from :class:`BaseException`, as
``KeyboardInterrupt`` does, so that a training loop's ``except Exception``
does not swallow it; ``graphwatch run`` ends the script there with exit code 0
and the report says the run was stopped at that step.

Example::

    >>> limit = StepLimitReached(3)
    >>> str(limit)
    'stopped at the end of step 2, as asked (--stop-after 3)'
    >>> isinstance(limit, Exception)
    False
"""

from __future__ import annotations


class StepLimitReached(BaseException):
    """The session ended its ``steps``-th step (steps 0 to ``steps - 1`` ran whole) and stops the run there."""

    def __init__(self, steps: int) -> None:
        super().__init__(steps)
        self.steps = steps

    def __str__(self) -> str:
        return f"stopped at the end of step {self.steps - 1}, as asked (--stop-after {self.steps})"


def check_step_limit(steps: int | None) -> int | None:
    """``steps`` when it is a usable limit (a whole number, at least 1, or None for none); else a ValueError.

    >>> check_step_limit(None), check_step_limit(4)
    (None, 4)
    """
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise ValueError(f"stop after {steps!r} steps: give a whole number of steps, at least 1")
    return steps
