"""Where a step ends and how closely it is watched: the training loop's step boundaries (``loop_steps``), the
detail plan (``detail``), what the cheap path watches for (``light_signals``), what is alive by the step
that made it (``live_steps``), the resident memory read at step ends (``resident``), and stopping a run
at a step boundary (``step_limit``).

The top room: imports ``causes`` (a light step's signals look for holders) and ``lines``.
"""
