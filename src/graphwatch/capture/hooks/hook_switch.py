"""graphwatch's saved-tensor hooks, pushed for the steps seen in full detail and popped for the others.

Saved-tensor hooks are a thread-local stack
(``torch._C._autograd._push_saved_tensors_default_hooks``); only the top pair
packs.  A session pushes its pair when it enters; at a step boundary it pops
it for a light step and pushes it again for a full one (:mod:`.detail`).  It
never takes the top from hooks the user entered inside the session
(``save_on_cpu``, a checkpoint's own hooks): when its pair is not on top to
pop, or the user's pair is on top where it would push, the switch waits for
the next boundary.  So the stack is what it would be without graphwatch
whenever the pair is popped, and user hooks are never hidden.

Example::

    >>> import torch
    >>> from graphwatch.capture.hooks.hook_switch import HookSwitch
    >>> hooks = (lambda t: t, lambda t: t)
    >>> switch = HookSwitch(hooks)
    >>> switch.set(True), torch._C._autograd._top_saved_tensors_default_hooks(False) == hooks
    (True, True)
    >>> switch.set(False), torch._C._autograd._top_saved_tensors_default_hooks(False)
    (False, None)
    >>> switch.remove()
"""

from __future__ import annotations

from typing import Any

import torch

_top = torch._C._autograd._top_saved_tensors_default_hooks
_push = torch._C._autograd._push_saved_tensors_default_hooks
_pop = torch._C._autograd._pop_saved_tensors_default_hooks


class HookSwitch:
    """Pushes and pops one (pack, unpack) pair above the hooks that were on top when it was made."""

    def __init__(self, hooks: tuple[Any, Any]) -> None:
        self.hooks = hooks
        self.below = _top(False)  # what was on top when the session entered (a user's outer hooks, or None)
        self.on = False

    def set(self, on: bool) -> bool:
        """Push (``on``) or pop the pair, if the stack allows it now; returns whether the pair is on."""
        if on != self.on:
            top = _top(False)
            if on and top == self.below:
                _push(*self.hooks)
                self.on = True
            elif not on and top == self.hooks:
                _pop()
                self.on = False
        return self.on

    def remove(self) -> None:
        """Pop the pair for good if it is pushed (on exit, whatever the exit)."""
        if self.on:
            self.on = False
            _pop()
