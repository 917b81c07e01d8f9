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
    >>> record = recorder.trace.saved[0]
    >>> record.kind, record.alive
    ('activation', True)
    >>> y.sum().backward()
    >>> record.alive
    False
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch

from ..model import SavedRecord

if TYPE_CHECKING:
    from .recorder import Recorder

PackHook = Callable[[torch.Tensor], Any]
UnpackHook = Callable[[Any], torch.Tensor]

_INPLACE_MESSAGE = (
    "one of the variables needed for gradient computation has been modified by an inplace operation: "
    "[{type} {shape}], which was saved at {where} (step {step}), is at version {now}; "
    "expected version {then} instead. Hint: the line above changed the tensor in place after autograd "
    "saved it; use the out-of-place form (e.g. x = x.add(1) instead of x.add_(1)) or .clone() it first."
)


class SavedHandle:
    """What autograd stores for one saved tensor while graphwatch watches."""

    __slots__ = ("alias", "version", "record", "node", "storage", "recorder", "inner")

    def __del__(self) -> None:
        try:
            self.recorder.saved_released(self)
        except Exception:  # never raise from a finalizer (e.g. at interpreter exit)
            pass


def _new_handle(recorder: Recorder, tensor: torch.Tensor, dedupe: bool) -> SavedHandle:
    """Record one saved tensor (the hot path: runs inside every op that saves)."""
    if recorder.boundary_pending:
        recorder.commit_boundary()
    storage = None
    try:
        if dedupe:
            untyped = tensor.untyped_storage()
            storage = (untyped.data_ptr(), tensor.is_cuda)
            size = untyped.nbytes()
        else:
            size = tensor.nbytes
    except (RuntimeError, NotImplementedError, TypeError):  # sparse, nested or storage-less tensors
        size = 0
    # is_leaf, not grad_fn: a grad_fn read makes a Python object for the node, which deepens the
    # C++ recursion that frees a long chain of nodes.  A view of a parameter (linear saves weight.t())
    # counts as the parameter.
    base = tensor._base
    if not tensor.is_leaf and (base is None or not base.is_leaf):
        kind = "activation"
    elif tensor.requires_grad:
        kind = "parameter"
    else:
        kind = "input"
    dtype = tensor.dtype
    site = recorder.sites.here(3)
    if not recorder.precise:  # the precise level notes lines per call instead
        recorder.clock.note_site(site)
    record = SavedRecord(
        next(recorder.saved_ids),
        recorder.step,
        site,
        size,
        kind,
        tensor.shape,
        recorder.dtype_names.get(dtype) or recorder.dtype_name(dtype),
        "cpu" if tensor.is_cpu else tensor.device.type,
    )
    handle = SavedHandle()
    handle.recorder = recorder
    handle.record = record
    handle.storage = storage
    handle.node = None  # set when a graph walk finds the owning node
    handle.inner = None  # what an outer user pack hook returned, when chained
    recorder.saved_packed(record, storage)
    return handle


def make_hooks(recorder: Recorder) -> tuple[PackHook, UnpackHook]:
    """The (pack, unpack) pair that records into ``recorder``."""

    def pack(tensor: torch.Tensor) -> SavedHandle:
        handle = _new_handle(recorder, tensor, True)
        handle.alias = tensor.detach()
        handle.version = tensor._version
        return handle

    def unpack(handle: SavedHandle) -> torch.Tensor:
        alias = handle.alias
        if alias._version != handle.version:
            raise RuntimeError(inplace_message(recorder, handle))
        handle.record.unpacked += 1
        return alias

    return pack, unpack


def make_chained_hooks(recorder: Recorder, outer_pack: PackHook, outer_unpack: UnpackHook) -> tuple[PackHook, UnpackHook]:
    """Hooks that record, then hand the tensor to hooks the user entered before the session.

    The outer hooks (e.g. ``torch.autograd.graph.save_on_cpu``) keep deciding
    where the tensor lives; graphwatch holds only what they return.
    """

    def pack(tensor: torch.Tensor) -> SavedHandle:
        handle = _new_handle(recorder, tensor, False)
        handle.alias = None  # the outer hooks decide where the tensor lives
        handle.inner = outer_pack(tensor)
        return handle

    def unpack(handle: SavedHandle) -> torch.Tensor:
        handle.record.unpacked += 1
        return outer_unpack(handle.inner)

    return pack, unpack


def inplace_message(recorder: Recorder, handle: SavedHandle) -> str:
    """torch's "modified by an inplace operation" message, with the line that saved the tensor."""
    alias = handle.alias
    record = handle.record
    return _INPLACE_MESSAGE.format(
        type=alias.type(),
        shape=list(alias.shape),
        where=recorder.trace.where(record.site),
        step=record.step,
        now=alias._version,
        then=handle.version,
    )
