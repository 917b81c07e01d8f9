"""What a user sees of saved tensors inside a session: the same as without one.

Default saved-tensor hooks change a few things torch shows, which graphwatch
puts right while a session is active (:func:`patch_saved_views`):

* ``grad_fn._raw_saved_x.register_hooks(pack, unpack)`` raises in torch when
  default hooks already packed that tensor; a tensor graphwatch packed takes
  the user's pair instead (:func:`~graphwatch.capture.hooks.saved.register_user_hooks`),
  and ``register_hooks`` keeps torch's own errors for the rest (wrong calls included);
* ``_raw_saved_x.data`` and ``.unpack_hook`` would show graphwatch's handle and
  unpack hook; they show the saved tensor (or what the user's pack hook
  returned) and the user's unpack hook, or None, as torch does;
* torch re-wraps every tensor an unpack hook returns, so ``ctx.saved_tensors``
  of a custom ``autograd.Function`` and ``_raw_saved_x.unpack()`` would give a
  new object for a saved input, without the attributes the user set on it;
  they give back the input itself (also with ``clear_saved_tensors_on_access``;
  inside ``jvp``, ``save_for_forward``'s tuple is torch's own).

One difference stays: the ``_saved_x`` attributes of built-in nodes
(``PowBackward0._saved_self``) belong to immutable C types, so there a saved
input comes back as an equal tensor, not the same Python object (as with any
default hooks, ``torch.autograd.graph.saved_tensors_hooks`` included).

Example::

    >>> import torch, graphwatch
    >>> with graphwatch.watch(summary=False):
    ...     b = torch.ones(2, requires_grad=True) + 1
    ...     y = b ** 2  # (a _raw_saved_ object is valid only while its node lives)
    ...     y.grad_fn._raw_saved_self.data is b, y.grad_fn._raw_saved_self.unpack_hook
    (True, None)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.autograd.function import BackwardCFunction

from .saved import SavedHandle, register_user_hooks

SavedTensor: Any = torch._C._autograd.SavedTensor  # (its stub lists none of what is patched here)
raw_data: Callable[[Any], Any] = SavedTensor.data.fget  # what the pack hook returned: graphwatch's handle
raw_unpack_hook: Callable[[Any], Any] = SavedTensor.unpack_hook.fget  # the hook that will unpack it, or None
_ctx_saved_tensors: Any = vars(torch._C._FunctionBase)["saved_tensors"].__get__


def _shown_data(raw: Any) -> Any:
    handle = raw_data(raw)
    if type(handle) is not SavedHandle:
        return handle
    return handle.inner if handle.user_unpack is not None else handle.alias


def _shown_unpack_hook(raw: Any) -> Any:
    handle = raw_data(raw)
    return handle.user_unpack if type(handle) is SavedHandle else raw_unpack_hook(raw)


def _given_back(handle: Any, tensor: Any) -> Any:
    """The saved input itself where torch without hooks would give it back; else ``tensor``."""
    if type(handle) is SavedHandle and handle.is_input and handle.alias is not None and tensor is not None:
        return handle.alias
    return tensor


def _register_hooks(original: Callable[..., None]) -> Callable[..., None]:
    def register_hooks(self: Any, *args: Any, **kwargs: Any) -> None:
        # any call torch would refuse (wrong arguments included) goes to torch, for its own error
        handle = raw_data(self)
        if type(handle) is SavedHandle and not kwargs and len(args) == 2 and all(map(callable, args)):
            if register_user_hooks(handle, *args):
                return
        original(self, *args, **kwargs)

    return register_hooks


def _unpack(original: Callable[..., Any]) -> Callable[..., Any]:
    def unpack(self: Any) -> Any:
        return _given_back(raw_data(self), original(self))  # the unpack hook runs: checks and errors

    return unpack


def _saved_tensors(ctx: Any) -> tuple[Any, ...]:
    """``ctx.saved_tensors`` with each saved input given back as the very object that was saved.

    The handles are read first: with ``clear_saved_tensors_on_access`` the access itself releases them.
    Inside ``jvp`` torch gives what ``save_for_forward`` kept, nothing packed: that tuple is given
    unchanged, as is torch's error once the saved tensors are freed.
    """
    if ctx.saved_for_forward is not None:
        return _ctx_saved_tensors(ctx)  # type: ignore[no-any-return]
    try:
        handles = [raw_data(raw) for raw in ctx._raw_saved_tensors]
    except RuntimeError:  # freed: torch's own access raises its own error
        handles = []
    tensors = _ctx_saved_tensors(ctx)  # runs the unpack hooks: graphwatch's checks, torch's errors
    if not handles:
        return tensors  # type: ignore[no-any-return]
    return tuple(map(_given_back, handles, tensors))


def patch_saved_views() -> Callable[[], None]:
    """Show saved tensors as torch does without graphwatch (see the module's text); returns the undo."""
    originals = {name: SavedTensor.__dict__[name] for name in ("register_hooks", "unpack", "data", "unpack_hook")}
    SavedTensor.register_hooks = _register_hooks(originals["register_hooks"])
    SavedTensor.unpack = _unpack(originals["unpack"])
    SavedTensor.data = property(_shown_data)
    SavedTensor.unpack_hook = property(_shown_unpack_hook)
    BackwardCFunction.saved_tensors = property(_saved_tensors)  # type: ignore[assignment]

    def undo() -> None:
        for name, original in originals.items():
            setattr(SavedTensor, name, original)
        del BackwardCFunction.saved_tensors

    return undo
