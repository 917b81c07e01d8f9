"""Saved-tensor hooks: see every tensor autograd saves, and the moment it is freed.

The pack hook returns a :class:`SavedHandle`: a small object that holds a
*detached alias* of the tensor (never the tensor itself: a saved output that
refers back to itself through its ``grad_fn`` would form a cycle through C++
that ``gc.collect()`` never frees).  Autograd owns the handle, so the handle's
``__del__`` runs exactly when autograd lets go of the saved tensor: when a
backward releases the graph, or when the graph is collected.

With saved-tensor hooks active torch skips its own check that a saved tensor
was not modified in place; :func:`make_hooks` restores it by comparing the
tensor's version counter at unpack with the one seen at pack.

Example::

    >>> import torch
    >>> from graphwatch.capture.recorder import Recorder
    >>> from graphwatch.capture.saved import make_hooks
    >>> recorder = Recorder()
    >>> pack, unpack = make_hooks(recorder)
    >>> x = torch.ones(3, requires_grad=True)
    >>> with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
    ...     y = x.exp()
    >>> record = recorder.saved_record(y.grad_fn._raw_saved_result.data)  # the trace's record of it
    >>> record.kind, record.alive
    ('activation', True)
    >>> y.sum().backward()
    >>> record.alive
    False
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable

import torch

if TYPE_CHECKING:
    from .recorder import Recorder

PackHook = Callable[[torch.Tensor], Any]
UnpackHook = Callable[[Any], torch.Tensor]

# torch's own text (SavedVariable::unpack); saved-tensor hooks switch that check off, like the version check
DETACHED_MESSAGE = (
    "Trying to use a saved tensor that has been detached in-place, i.e. with .detach_()."
    "This is not supported, please use out-of-place `.detach()` instead"
)
_next_sequence_nr = torch._C._autograd._get_sequence_nr

_INPLACE_MESSAGE = (
    "one of the variables needed for gradient computation has been modified by an inplace operation: "
    "[{type} {shape}], which was saved at {where} (step {step}), is at version {now}; "
    "expected version {then} instead. {hint}"
)
_INPLACE_HINT = (
    "Hint: the line above changed the tensor in place after autograd saved it; use the out-of-place form "
    "(e.g. x = x.add(1) instead of x.add_(1)) or .clone() it first."
)


class SavedHandle:
    """What autograd stores for one saved tensor while graphwatch watches.

    It carries what the pack hook learnt cheaply (step, call site, kind, bytes);
    the :class:`~graphwatch.model.SavedRecord` of the trace is built from it
    only when needed (:meth:`Recorder.saved_record`): when a graph walk links it
    to its node, when it outlives its step, or at once at the precise level.
    """

    __slots__ = (
        "alias", "version", "original", "inner", "recorder", "step", "site", "kind", "storage", "nbytes",
        "unpacks", "record", "node", "__weakref__",
    )  # fmt: skip

    def __del__(self) -> None:
        try:
            self.recorder.saved_released(self)
        except Exception:  # never raise from a finalizer (e.g. at interpreter exit)
            pass

    def shape(self) -> tuple[int, ...]:
        """The saved tensor's shape (from its record when the alias belongs to a user's hooks)."""
        return tuple(self.alias.shape) if self.alias is not None else (self.record.shape if self.record else ())


def _new_handle(recorder: Recorder, tensor: torch.Tensor, leaf: bool) -> SavedHandle:
    """Note one saved tensor (the hot path: runs inside every op that saves)."""
    if recorder.boundary_pending:
        recorder.commit_boundary()
    try:
        untyped = tensor.untyped_storage()
        storage = (untyped.data_ptr(), tensor.is_cuda)
        size = untyped.nbytes()
    except (RuntimeError, NotImplementedError, TypeError):  # sparse, nested or storage-less tensors
        storage, size = None, 0
    # is_leaf, not grad_fn: a grad_fn read makes a Python object for the node, which deepens the
    # C++ recursion that frees a long chain of nodes.  A view of a parameter (linear saves weight.t())
    # counts as the parameter.
    handle = SavedHandle()
    if not leaf:
        base = tensor._base
        handle.kind = "activation" if base is None or not base.is_leaf else "parameter"
    else:
        handle.kind = "parameter" if tensor.requires_grad else "input"
    handle.site = recorder.pack_site()
    handle.recorder = recorder
    handle.step = recorder.step
    handle.storage = storage
    handle.nbytes = size
    handle.unpacks = 0
    handle.record = None  # built when needed (Recorder.saved_record)
    handle.node = None  # set when a graph walk finds the owning node
    handle.inner = None  # what an outer user pack hook returned, when chained
    handle.original = None
    recorder.saved_packed(handle)
    return handle


def make_hooks(recorder: Recorder) -> tuple[PackHook, UnpackHook]:
    """The (pack, unpack) pair that records into ``recorder``."""

    def pack(tensor: torch.Tensor) -> SavedHandle:
        leaf = tensor.is_leaf
        handle = _new_handle(recorder, tensor, leaf)
        handle.version = tensor._version
        # Without hooks torch keeps a saved input itself, not a copy: a later `.data = ...` on it shows
        # in the backward, and a `.detach_()` of it is an error.
        if leaf:  # a leaf cannot lead back to the graph: keep it, as torch does
            handle.alias = tensor
        else:
            handle.alias = tensor.detach()  # never the tensor itself: a saved output would keep its graph forever
            # An output of the op saving it has the node being made, numbered last, as grad_fn: torch keeps a
            # copy of those, as the alias is.  For the others a weak reference gives torch's behaviour without
            # keeping anything alive (a custom Function that makes nodes in its forward is taken for an input).
            if tensor.grad_fn._sequence_nr() != _next_sequence_nr() - 1:
                handle.original = weakref.ref(tensor)
        if recorder.detail_always:
            recorder.saved_record(handle)
        return handle

    def unpack(handle: SavedHandle) -> torch.Tensor:
        original = handle.original
        tensor = original() if original is not None else None
        if tensor is None:
            tensor = handle.alias
        elif tensor.grad_fn is None:
            raise RuntimeError(DETACHED_MESSAGE)
        if tensor._version != handle.version:
            raise RuntimeError(inplace_message(recorder, handle, tensor))
        handle.unpacks += 1
        if handle.record is not None:
            handle.record.unpacked = handle.unpacks
        return tensor

    return pack, unpack


def make_chained_hooks(recorder: Recorder, outer_pack: PackHook, outer_unpack: UnpackHook) -> tuple[PackHook, UnpackHook]:
    """Hooks that record, then hand the tensor to hooks the user entered before the session.

    The outer hooks (e.g. ``torch.autograd.graph.save_on_cpu``) keep deciding
    where the tensor lives; graphwatch holds only what they return.
    """

    def pack(tensor: torch.Tensor) -> SavedHandle:
        handle = _new_handle(recorder, tensor, tensor.is_leaf)
        handle.alias = None  # the outer hooks decide where the tensor lives
        recorder.saved_record(handle, tensor)  # built now: the tensor is out of reach later
        handle.inner = outer_pack(tensor)
        return handle

    def unpack(handle: SavedHandle) -> torch.Tensor:
        handle.unpacks += 1
        handle.record.unpacked = handle.unpacks
        return outer_unpack(handle.inner)

    return pack, unpack


def inplace_message(recorder: Recorder, handle: SavedHandle, tensor: torch.Tensor | None = None) -> str:
    """torch's "modified by an inplace operation" message, with the line that saved the tensor."""
    alias = handle.alias if tensor is None else tensor
    return _INPLACE_MESSAGE.format(
        type=alias.type(),
        shape=list(alias.shape),
        where=recorder.trace.where(handle.site),
        step=handle.step,
        now=alias._version,
        then=handle.version,
        hint=recorder.inplace_hint(handle) or _INPLACE_HINT,  # an optimizer.step() is named as the cause
    )
