"""What trained: per optimizer, and per parameter it owns, whether a backward gave it a gradient.

A :class:`ParameterLedger` installs its own global optimizer pre-step hook (a
session calls its :meth:`~ParameterLedger.before_step` from the session's own).
The first time an optimizer steps it gets an index (the order in which
optimizers first step), its class and the variable that holds it, and each of
its parameters a record: group, index, shape, and the name the user's frames
give it (``netD.main.0.weight``).  At each step of that optimizer a parameter
that holds a gradient (any, then a non-zero one) for the first time notes the
step, and one that requires a gradient but holds none counts the step as
bare (a ``step(closure)`` is not counted: its closure makes the gradients
after this hook).  Each step looks only at the parameters not yet seen with
a non-zero gradient: once all of an optimizer's parameters have one, its steps
cost a dictionary look-up.

Example::

    >>> import torch
    >>> model = torch.nn.Linear(3, 1)
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> with ParameterLedger(step=lambda: 0) as ledger:
    ...     model(torch.ones(2, 3)).sum().backward()
    ...     opt.step()
    >>> optimizers, parameters = ledger.records()
    >>> optimizers[0].label, [(p.name, p.trained) for p in parameters]
    ('opt (SGD)', [('model.weight', True), ('model.bias', True)])
"""

from __future__ import annotations

import gc
import inspect
import sys
import weakref
from collections.abc import Callable
from operator import itemgetter
from types import FrameType, TracebackType
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from ...errors import notify
from ...model.training import OptimizerRecord, ParameterRecord
from ..hooks.optimizer import is_wrapper, unwrapped
from ..lines.callsite import in_installed_package
from ..lines.frames import local_value, user_frames
from .held_values import attribute_items
from .holders import parameter_names
from .parameter_cuts import find_parameter_cut

_PARAMS = itemgetter("params")  # a param group's parameters
_NAMING_FRAMES = 8  # the innermost user frames whose variables name an optimizer or a parameter


class _Seen:
    """One optimizer's records, and which of its parameters have not had a non-zero gradient yet."""

    __slots__ = ("count", "params", "pending", "record", "ref", "searched")

    def __init__(self, optimizer: torch.optim.Optimizer, record: OptimizerRecord) -> None:
        self.ref = weakref.ref(optimizer)
        self.record = record
        self.params: list[ParameterRecord] = []
        self.count = -1  # parameters it owned when they were last listed
        self.pending: list[int] = []  # indices in params of those with no non-zero gradient so far
        self.searched = False  # whether the cut between its bare parameters and the loss was looked for


class ParameterLedger:
    """Records what each optimizer trains while entered (see the module's docstring).

    ``step``: the index of the step in progress (the session's), read at each optimizer step.  ``site``: the
    call site id of a frame, or of a line of it (the session's
    :meth:`~graphwatch.capture.lines.callsite.SiteTable.from_frame`), read at each optimizer's first step, and where
    the parameters it steps without a gradient were cut off (:mod:`.parameter_cuts`).  ``reached``: whether a
    backward since the optimizer's last step reached a parameter (the session's
    :meth:`~graphwatch.capture.hooks.optimizer.GradResetTracker.reached`).
    """

    def __init__(
        self, step: Callable[[], int], site: Callable[..., int | None] | None = None,
        reached: Callable[[torch.Tensor], bool] | None = None,
    ) -> None:  # fmt: skip
        self._step = step
        self._site = site
        self._reached = reached
        self._seen: dict[int, _Seen] = {}  # id(optimizer) -> its records
        # the records of the optimizers that stepped so far, in the order of their first step: a session's trace
        # holds this list while it runs (a step's finding names the optimizer its step stepped), then records()
        self.stepped: list[OptimizerRecord] = []
        self._handle: Any = None
        self._unstepped: list[OptimizerRecord] = []
        self._unstepped_params: list[ParameterRecord] = []

    def __enter__(self) -> ParameterLedger:
        self._handle = register_optimizer_step_pre_hook(self.before_step)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def records(self) -> tuple[list[OptimizerRecord], list[ParameterRecord]]:
        """The optimizers (by index) and their parameters (by optimizer, group, index)."""
        seen = sorted(self._seen.values(), key=lambda s: s.record.index)
        optimizers = [s.record for s in seen] + self._unstepped
        return optimizers, [p for s in seen for p in s.params] + self._unstepped_params

    def find_unstepped(self, stopped: TracebackType | None = None) -> None:
        """Add the optimizers alive now that never stepped (found by a scan of the garbage collector's
        objects: call it once, where the run stops), with their parameters; the frames of ``stopped`` (the
        traceback of the exception that stopped the run) name them."""
        frame = None
        while stopped is not None:
            frame, stopped = stopped.tb_frame, stopped.tb_next
        known = {id(s.ref()) for s in self._seen.values()}
        # (type(), not isinstance: a lazy proxy's __class__ can warn or raise; a wrapper is the optimizer it wraps)
        found = [o for o in gc.get_objects()
                 if issubclass(type(o), torch.optim.Optimizer) and id(o) not in known and not is_wrapper(o)]  # fmt: skip
        index = len(self._seen)
        for optimizer in found:
            record = OptimizerRecord(index=index, kind=type(optimizer).__name__, name=_variable_name(frame, optimizer))
            self._unstepped.append(record)
            self._unstepped_params += _parameter_records(optimizer, index, frame)
            index += 1

    # ------------------------------------------------------------------ hook
    def before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """An optimizer step pre-hook: entered, the ledger installs it; a session calls it from its own."""
        seen = self._seen.get(id(optimizer))
        if seen is None or seen.ref() is not optimizer:
            frame = sys._getframe(1)
            record = OptimizerRecord(index=len(self._seen), kind=type(optimizer).__name__, name=_variable_name(frame, optimizer))
            record.site = self._site(frame) if self._site is not None else None
            seen = self._seen[id(optimizer)] = _Seen(optimizer, record)
            self.stepped.append(record)
        step = self._step()
        record = seen.record
        record.steps += 1
        if record.first_step is None:
            record.first_step = step
        count = sum(map(len, map(_PARAMS, optimizer.param_groups)))  # (C-level maps: every step of every run)
        if count != seen.count:  # first step, or add_param_group since
            named = {p.key: p for p in seen.params}
            seen.params = [named.get(p.key, p) for p in _parameter_records(optimizer, record.index, sys._getframe(1))]
            seen.count = count
            seen.pending = [i for i, entry in enumerate(seen.params) if entry.first_grad_step is None]
        if seen.pending:
            closure = args[1] if len(args) > 1 else kwargs.get("closure")  # (args[0]: the optimizer itself)
            _note_gradients(seen, optimizer, step, count_bare=closure is None, reached=self._reached)
            if not seen.searched:
                self._note_cut(seen, optimizer, sys._getframe(1))

    def _note_cut(self, seen: _Seen, optimizer: torch.optim.Optimizer, frame: FrameType) -> None:
        """At the first step at which parameters that never held a gradient hold none: where they were cut off
        from the loss backwarded before the step (:func:`.parameter_cuts.find_parameter_cut`), on the record."""
        bare = [i for i in seen.pending if seen.params[i].first_held_step is None and seen.params[i].bare_steps]
        if not bare:
            return
        seen.searched = True
        user = next(user_frames(frame), None)
        if user is None or self._site is None:
            return
        params = [param for group in optimizer.param_groups for param in group["params"]]
        try:
            cut = find_parameter_cut(user, [params[i] for i in bare])
        except Exception as error:  # looking closer must never stop the run
            notify(f"graphwatch: could not look for what cuts the parameters off ({error!r})", stacklevel=2)
            return
        if cut is not None:
            record = seen.record
            record.cut_at, record.cut_op, record.cut_what = self._site(user, cut.line), cut.op, cut.what
            record.cut_block_at = self._site(user, cut.block) if cut.block is not None else None


def _note_gradients(
    seen: _Seen, optimizer: torch.optim.Optimizer, step: int, count_bare: bool,
    reached: Callable[[torch.Tensor], bool] | None = None,
) -> None:  # fmt: skip
    """Note, for each pending parameter, the first step it holds a gradient, then a non-zero one; or count the
    step as bare (``count_bare``) when it requires a gradient and holds none, and as reset too when a backward
    since the last step ``reached`` it."""
    params = [param for group in optimizer.param_groups for param in group["params"]]
    entries = seen.params
    for i in seen.pending:
        entry, param = entries[i], params[i]
        if entry.first_held_step is None:
            if param.grad is None:
                if count_bare and param.requires_grad:
                    entry.bare_steps += 1
                    if reached is not None and reached(param):
                        entry.reset_steps += 1
                continue
            entry.first_held_step = step
        if _has_gradient(param):
            entry.first_grad_step = step
    seen.pending = [i for i in seen.pending if entries[i].first_grad_step is None]


def _has_gradient(param: torch.Tensor) -> bool:
    """Whether a backward left a gradient in ``param`` (a gradient of zeros, as ``zero_grad(set_to_none=False)``
    leaves, is none)."""
    grad = param.grad
    if grad is None:
        return False
    if grad.is_sparse or grad.device.type == "meta":
        return True
    return bool(grad.any())


def _parameter_records(optimizer: torch.optim.Optimizer, index: int, frame: FrameType | None) -> list[ParameterRecord]:
    names = {id(tensor): name for name, tensor in _tensor_names(frame).items()}
    return [
        ParameterRecord(optimizer=index, group=g, index=i, shape=tuple(param.shape), name=names.get(id(param), ""))
        for g, group in enumerate(optimizer.param_groups)
        for i, param in enumerate(group["params"])
    ]


def _tensor_names(frame: FrameType | None) -> dict[str, torch.Tensor]:
    """The parameters of the modules the user's frames hold, then tensors the frames hold by name."""
    names = parameter_names(frame)
    seen = {id(t) for t in names.values()}
    for name, value in _frame_variables(frame):
        if issubclass(type(value), torch.Tensor) and value.is_leaf and id(value) not in seen:
            seen.add(id(value))
            names[name] = value
    return names


def _variable_name(frame: FrameType | None, obj: object) -> str:
    """The name the user's frames give ``obj`` (``optimizerD``, ``self.opt``), or a wrapper of it (Lightning's
    ``opt = self.optimizers()``), or "": the script's own frames first, then an installed package's
    (accelerate's ``self.optimizer``, the wrapper's name for what the script calls ``opt``); in a frame, the
    optimizer's own name before a wrapper's."""
    frames = list(user_frames(frame))[:_NAMING_FRAMES]
    frames.sort(key=lambda f: in_installed_package(f.f_code.co_filename))  # (stable: innermost first in each)
    for user_frame in frames:
        named = _variables_of(user_frame)
        found = next((name for name, value in named if value is obj), None) or next(
            (name for name, value in named if unwrapped(value) is obj), None  # (a wrapper of it)
        )
        if found:
            return found
    return ""


def _frame_variables(frame: FrameType | None) -> list[tuple[str, Any]]:
    """(name, value) of the innermost user frames: locals, attributes of ``self``, then globals."""
    return [pair for user_frame in list(user_frames(frame))[:_NAMING_FRAMES] for pair in _variables_of(user_frame)]


def _variables_of(user_frame: FrameType) -> list[tuple[str, Any]]:
    code = user_frame.f_code
    names = (*code.co_varnames, *code.co_cellvars) if code.co_flags & inspect.CO_OPTIMIZED else ()  # a function
    found = [(name, local_value(user_frame, name)) for name in names]
    owner = local_value(user_frame, "self") if "self" in names else None
    if owner is not None:
        found += [(f"self.{attr}", value) for attr, value in attribute_items(owner, None) if not attr.startswith("_")]
    found += [(name, value) for name, value in list(user_frame.f_globals.items()) if not name.startswith("_")]
    return found
