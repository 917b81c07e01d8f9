"""The precise level: a TorchFunctionMode that gives every node the line of the call that made it.

The default level learns lines from saved-tensor pack hooks, which leaves
guesses for nodes that save nothing.  This mode sees every top-level torch
call (modes are switched off inside their own handler, so the ops a
composite call runs inside it are not seen separately), reads the sequence
number before and after it, and notes the user's line for the numbers in
between: every node the call made, its first ones included.  It costs a
Python call per torch call, so it is opt-in: ``graphwatch.watch(level="precise")``.

Example::

    >>> import torch
    >>> from graphwatch.capture.recorder import Recorder
    >>> from graphwatch.capture.hooks.call_mode import CallSiteMode
    >>> recorder = Recorder()
    >>> x = torch.ones(2, 3, requires_grad=True)
    >>> with CallSiteMode(recorder):
    ...     y = torch.einsum("ij,kj->ik", x, x)
    >>> recorder.trace.sites[recorder.clock.site_of(y.grad_fn._sequence_nr())].function
    '<module>'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch.compiler import is_compiling
from torch.overrides import TorchFunctionMode

from ..lines.step_clock import next_sequence_nr

if TYPE_CHECKING:
    from ..recorder import Recorder


class CallSiteMode(TorchFunctionMode):
    """Notes, for each torch call that creates nodes, the line of user code that made it."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self._recorder = recorder

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if is_compiling():  # torch.compile traces modes into its graph: there, be nothing at all
            return func(*args, **(kwargs or {}))
        start = next_sequence_nr()
        result = func(*args, **(kwargs or {}))
        if next_sequence_nr() != start:
            recorder = self._recorder
            recorder.clock.note_call(start, recorder.sites.here(2))
        return result
