"""Saved-tensor hooks: see every tensor autograd saves, and the moment it is freed.

The pack hook returns a :class:`SavedHandle`, a small object that holds what
torch itself would hold without hooks: a saved *input* (a leaf, or a tensor an
earlier op made) is held itself, strongly, so its Python object lives exactly
as long as the graph needs it and ``ctx.saved_tensors`` gives it back with its
attributes (see :func:`saved_tensors`); a saved *output* of the op being
recorded is held as a detached alias, as torch does, because the tensor itself
refers back to its node through ``grad_fn`` and would form a cycle through C++
that ``gc.collect()`` never frees.  Autograd owns the handle, so the handle's
``__del__`` runs exactly when autograd lets go of the saved tensor: when a
backward releases the graph, or when the graph is collected.

With saved-tensor hooks active torch skips its own check that a saved tensor
was not modified in place; :func:`make_hooks` restores it by comparing the
tensor's version counter at unpack with the one seen at pack.  A user's own
per-tensor hooks (``grad_fn._raw_saved_x.register_hooks(pack, unpack)``) are
chained inside the handle (:func:`register_user_hooks`).

Example::

    >>> import torch
    >>> from graphwatch.capture.recorder import Recorder
    >>> from graphwatch.capture.hooks.saved import make_hooks
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

import re
from collections.abc import Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch

from .inplace_hints import HintRecorder, inplace_addition

if TYPE_CHECKING:
    from ...model import NodeRecord, SavedRecord

PackHook = Callable[[torch.Tensor], Any]
UnpackHook = Callable[[Any], torch.Tensor]

# torch's own texts (SavedVariable::unpack, ::set_hooks_and_pack_data); hooks switch the first check off
DETACHED_MESSAGE = (
    "Trying to use a saved tensor that has been detached in-place, i.e. with .detach_()."
    "This is not supported, please use out-of-place `.detach()` instead"
)
PACK_INPLACE_MESSAGE = (
    "A saved tensor pack hook is modifying its input in place. Tensors provided as input to pack hook cannot be "
    "modified by in-place operations as this can lead to unexpected side-effects. Please open an issue if you need "
    "to perform in-place operations on the input to a pack hook."
)
_next_sequence_nr = torch._C._autograd._get_sequence_nr

# torch's own text (SavedVariable::unpack), which graphwatch gives first and unchanged, then adds to
_TORCH_INPLACE_MESSAGE = (
    "one of the variables needed for gradient computation has been modified by an inplace operation: "
    "[{type} {shape}]{output} is at version {now}; expected version {then} instead. {hint}"
)
_TORCH_INPLACE_HINT = (
    "Hint: enable anomaly detection to find the operation that failed to compute its gradient, with "
    "torch.autograd.set_detect_anomaly(True, check_nan=False)."
)
_TORCH_ANOMALY_HINT = (
    "Hint: the backtrace further above shows the operation that failed to compute its gradient. The variable "
    "in question was changed in there or anywhere later. Good luck!"
)
# as torch names the op in that message: ExpBackward0 "Exp", ClampBackward1 "Clamp1", CopyBackwards itself
_BACKWARD_SUFFIX = re.compile(r"Backward(?:0$|(?=[1-9])|$)")


class PackingRecorder(HintRecorder, Protocol):
    """What the hooks and handles call on the recorder (:class:`~graphwatch.capture.recorder.Recorder` is one)."""

    boundary_pending: bool
    detail_always: bool

    def commit_boundary(self) -> None: ...
    def counts_only(self) -> bool: ...
    def pack_site(self) -> int | None: ...
    def saved_counted(self) -> None: ...
    def saved_packed(self, handle: SavedHandle) -> None: ...
    def saved_record(self, handle: SavedHandle, tensor: torch.Tensor | None = None) -> SavedRecord: ...
    def saved_released(self, handle: SavedHandle) -> None: ...


class SavedHandle:
    """What autograd stores for one saved tensor while graphwatch watches.

    ``alias`` is the tensor torch would keep (the input itself, or a detached
    alias of an output; None once a user's hooks own it, or when hooks entered
    before the session decide where it lives).  It carries what the pack hook
    learnt cheaply (step, call site, kind, bytes); the
    :class:`~graphwatch.model.SavedRecord` of the trace is built from it only
    when needed (:meth:`Recorder.saved_record`): when a graph walk links it to
    its node, when it outlives its step, or at once at the precise level.
    """

    __slots__ = (
        "__weakref__",
        "alias",
        "inner",
        "is_input",
        "kind",
        "leaf",
        "nbytes",
        "node",
        "output_of",
        "record",
        "recorder",
        "site",
        "step",
        "storage",
        "unpacks",
        "user_unpack",
        "version",
    )  # fmt: skip
    alias: Any  # a Tensor; None once a user's hooks own it, or outer hooks decide where it lives
    inner: Any  # what an outer pack hook (or a user's per-tensor pack hook) returned
    is_input: bool
    kind: str
    leaf: bool
    nbytes: int
    node: NodeRecord | None
    output_of: tuple[str, int] | None
    record: SavedRecord | None
    recorder: PackingRecorder
    site: int | None
    step: int
    storage: tuple[int, bool] | None
    unpacks: int
    user_unpack: UnpackHook | None
    version: int

    def __del__(self) -> None:
        try:
            self.recorder.saved_released(self)
        except Exception:  # never raise from a finalizer (e.g. at interpreter exit)
            pass

    def shape(self) -> tuple[int, ...]:
        """The saved tensor's shape (from its record when the alias belongs to a user's hooks)."""
        alias = self.alias
        if alias is not None and not alias.is_nested:
            return tuple(alias.shape)
        return self.record.shape if self.record else ()


def _new_handle(recorder: PackingRecorder, tensor: torch.Tensor, leaf: bool) -> SavedHandle:
    """Note one saved tensor (the hot path: runs inside every op that saves).

    Past the step's budget (:meth:`Recorder.counts_only`) the handle keeps what torch needs and nothing the
    recorder finds it by: no storage key (its bytes are not counted), no weak reference, no record."""
    if recorder.boundary_pending:
        recorder.commit_boundary()
    counted_only = recorder.counts_only()
    if counted_only or tensor.is_nested:  # nested: no sizes, no single storage: NestedTensorImpl raises on both
        storage, size = None, 0
    else:
        try:
            untyped = tensor.untyped_storage()
            storage = (untyped.data_ptr(), tensor.is_cuda)
            size = untyped.nbytes()
        except (RuntimeError, NotImplementedError, TypeError):  # sparse or storage-less tensors
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
    handle.leaf = leaf
    handle.site = recorder.pack_site()
    handle.recorder = recorder
    handle.step = recorder.step
    handle.storage = storage
    handle.nbytes = size
    handle.unpacks = 0
    handle.record = None  # built when needed (Recorder.saved_record)
    handle.node = None  # set when a graph walk finds the owning node
    handle.inner = None  # what an outer pack hook (or a user's per-tensor pack hook) returned
    handle.user_unpack = None  # a user's per-tensor unpack hook (register_user_hooks)
    if counted_only:
        recorder.saved_counted()
    else:
        recorder.saved_packed(handle)
    return handle


def _build_record(recorder: PackingRecorder, handle: SavedHandle, tensor: torch.Tensor) -> None:
    """Build the handle's record now, from ``tensor``; a nested tensor (no single shape) is described by its
    dtype and device only, since NestedTensorImpl raises on ``.shape``."""
    if tensor.is_nested:
        described = SimpleNamespace(shape=(), dtype=tensor.dtype, is_cpu=tensor.is_cpu, device=tensor.device)
        recorder.saved_record(handle, cast(torch.Tensor, described))
    else:
        recorder.saved_record(handle, tensor)


_OUTPUTS: dict[tuple[str, int], tuple[str, int]] = {}  # one shared (name, number) pair per op name and output


def _output_of(tensor: torch.Tensor) -> tuple[str, int] | None:
    """(node name, output number) when a non-leaf tensor is an output of the op saving it (its node is
    the one numbered last), else None.

    (A custom Function that makes nodes in its forward numbers them after its own: its outputs are
    then taken for inputs, as before.)
    """
    node: Any = tensor.grad_fn  # a non-leaf's: never None
    if node._sequence_nr() != _next_sequence_nr() - 1:
        return None
    key = (node.name(), tensor.output_nr)
    return _OUTPUTS.setdefault(key, key)  # the pair a handle keeps is shared, not one per saved tensor


def make_hooks(recorder: PackingRecorder) -> tuple[PackHook, UnpackHook]:
    """The (pack, unpack) pair that records into ``recorder``."""

    def pack(tensor: torch.Tensor) -> SavedHandle:
        leaf = tensor.is_leaf
        handle = _new_handle(recorder, tensor, leaf)
        handle.version = tensor._version
        # As torch without hooks: an input is kept itself (a later `.data = ...` on it shows in the backward,
        # a `.detach_()` of it is an error, its Python object and attributes live on); an output is kept as a
        # detached alias, never itself (it would keep its own graph alive forever).
        output_of = None if leaf else _output_of(tensor)
        handle.output_of = output_of
        if output_of is None:
            handle.alias = tensor
            handle.is_input = True
        else:
            handle.alias = tensor.detach()
            handle.is_input = False
        if recorder.detail_always or tensor.is_nested:  # a walk cannot build a nested tensor's record later
            _build_record(recorder, handle, tensor)
        return handle

    def unpack(handle: SavedHandle) -> torch.Tensor:
        handle.unpacks += 1
        if handle.record is not None:
            handle.record.unpacked = handle.unpacks
        if handle.user_unpack is not None:  # the user's own hooks for this tensor decide (no version check)
            return handle.user_unpack(handle.inner)
        tensor = handle.alias
        if handle.is_input and not handle.leaf and tensor.grad_fn is None:
            raise RuntimeError(DETACHED_MESSAGE)
        if tensor._version != handle.version:
            raise RuntimeError(inplace_message(recorder, handle, tensor))
        return tensor

    return pack, unpack


def make_chained_hooks(
    recorder: PackingRecorder, outer_pack: PackHook, outer_unpack: UnpackHook
) -> tuple[PackHook, UnpackHook]:
    """Hooks that record, then hand the tensor to hooks the user entered before the session.

    The outer hooks (e.g. ``torch.autograd.graph.save_on_cpu``) keep deciding
    where the tensor lives; graphwatch holds only what they return.
    """

    def pack(tensor: torch.Tensor) -> SavedHandle:
        handle = _new_handle(recorder, tensor, tensor.is_leaf)
        handle.alias = None  # the outer hooks decide where the tensor lives
        handle.is_input = False
        handle.output_of = None
        _build_record(recorder, handle, tensor)  # built now: the tensor is out of reach later
        handle.inner = outer_pack(tensor)
        handle.user_unpack = outer_unpack  # shown as the tensor's unpack hook, as torch shows it
        return handle

    def unpack(handle: SavedHandle) -> torch.Tensor:
        handle.unpacks += 1
        if handle.record is not None:
            handle.record.unpacked = handle.unpacks
        return outer_unpack(handle.inner)

    return pack, unpack


def register_user_hooks(handle: SavedHandle, pack_hook: PackHook, unpack_hook: UnpackHook) -> bool:
    """Chain a user's ``register_hooks(pack_hook, unpack_hook)`` for the tensor ``handle`` holds.

    Does what torch does for a saved tensor without hooks: the pack hook runs
    now (without grad) on the tensor, the handle keeps only what it returns,
    and the unpack hook gives the tensor back in the backward.  Returns False
    when torch itself would refuse (hooks entered before the session own the
    tensor, or the user already registered a pair): the caller lets torch raise.
    """
    tensor = handle.alias
    if tensor is None or handle.user_unpack is not None:
        return False
    if handle.record is None:
        _build_record(handle.recorder, handle, tensor)  # the record keeps shape and dtype once the tensor is the user's
    version = tensor._version
    with torch.no_grad():
        inner = pack_hook(tensor.detach() if handle.is_input else tensor)
    if tensor._version != version:
        raise RuntimeError(PACK_INPLACE_MESSAGE)
    handle.inner, handle.user_unpack, handle.alias = inner, unpack_hook, None
    return True


def inplace_message(recorder: PackingRecorder, handle: SavedHandle, tensor: torch.Tensor | None = None) -> str:
    """torch's "modified by an inplace operation" message, unchanged, then graphwatch's paragraph: the line that
    saved the tensor and, where graphwatch finds it, what changed it (:mod:`graphwatch.capture.hooks.inplace_hints`)."""
    alias = handle.alias if tensor is None else tensor
    if handle.output_of is not None:
        name, number = handle.output_of
    elif handle.is_input and alias.grad_fn is not None:  # torch names its grad_fn now, as for any input
        name, number = alias.grad_fn.name(), alias.output_nr
    else:
        name, number = "", 0
    output = f", which is output {number} of {_BACKWARD_SUFFIX.sub('', name)}," if name else ""
    text = _TORCH_INPLACE_MESSAGE.format(
        type=alias.type(),
        shape=alias._nested_tensor_size().tolist() if alias.is_nested else list(alias.shape),
        output=output,
        now=alias._version,
        then=handle.version,
        hint=_TORCH_ANOMALY_HINT if torch.is_anomaly_enabled() else _TORCH_INPLACE_HINT,
    )
    return text + inplace_addition(recorder, handle, alias)
