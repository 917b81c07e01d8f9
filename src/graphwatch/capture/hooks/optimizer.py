"""Global optimizer hooks: step boundaries with no code change, and gradient resets.

``torch.optim.optimizer.register_optimizer_step_{pre,post}_hook`` see every
``optimizer.step()`` of every optimizer.  The post hook ends a step.  The
pair also tells whether gradients were reset between two optimizer steps:
after a step graphwatch notes each gradient tensor and its version counter;
before the next step, a gradient that is the same tensor, and whose version
had not moved when the first backward since that step started to accumulate
into it, was never zeroed (``zero_grad()`` either replaces it with None or
bumps its version; what the backwards and ``clip_grad_norm_`` do to it after
that, in place, bumps it too, and does not count).

:class:`OptimizerSteps` notes each optimizer's last step (weakly), what names an ``optimizer.step()`` as the
cause of a "modified by an inplace operation" error.  A wrapper (accelerate's ``AcceleratedOptimizer``,
Lightning's ``LightningOptimizer``) is the optimizer it wraps (:func:`unwrapped`): only that one steps.

Example::

    >>> import torch
    >>> from graphwatch.capture.hooks.optimizer import GradResetTracker
    >>> p = torch.nn.Parameter(torch.ones(2))
    >>> opt = torch.optim.SGD([p], lr=0.1)
    >>> tracker = GradResetTracker()
    >>> for _ in range(2):
    ...     tracker.accumulated([p]); (p * 2).sum().backward()  # (told as the backward starts)
    ...     stale = tracker.before_step(opt); opt.step(); tracker.after_step(opt)
    >>> stale
    1
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

Hook = Callable[[torch.optim.Optimizer, tuple, dict], None]


# The attributes that hold the optimizer a wrapper steps: accelerate's AcceleratedOptimizer (``optimizer``),
# Lightning's LightningOptimizer (``_optimizer``).  A wrapper is an Optimizer (a subclass, or a class made to
# pass for one) that never runs Optimizer's own step: only the optimizer it wraps steps.
_WRAPPED_AT = ("optimizer", "_optimizer")
_MAX_WRAPS = 4  # wrappers followed down, at most


def unwrapped(optimizer: object) -> object:
    """The optimizer that ``optimizer`` wraps, through every wrapper (itself when it wraps none): what steps,
    and what graphwatch's hooks see.

    >>> sgd = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
    >>> class Wrapper(torch.optim.Optimizer):  # as accelerate's AcceleratedOptimizer keeps it
    ...     def __init__(self, optimizer): self.optimizer = optimizer
    >>> unwrapped(Wrapper(Wrapper(sgd))) is sgd, unwrapped(sgd) is sgd, unwrapped("opt")
    (True, True, 'opt')
    """
    for _ in range(_MAX_WRAPS):
        inner = _wrapped(optimizer)
        if inner is None:
            break
        optimizer = inner
    return optimizer


def is_wrapper(optimizer: object) -> bool:
    """Whether ``optimizer`` wraps another optimizer (:func:`unwrapped`): the same optimizer, not one more."""
    return _wrapped(optimizer) is not None


def _wrapped(value: object) -> object | None:
    # (type(), and the instance's own __dict__: a lazy proxy's __class__ or __getattr__ can warn or raise)
    if not issubclass(type(value), torch.optim.Optimizer):
        return None
    attributes = getattr(value, "__dict__", None)
    if not isinstance(attributes, dict):
        return None
    for name in _WRAPPED_AT:
        inner = attributes.get(name)
        if inner is not value and issubclass(type(inner), torch.optim.Optimizer):
            return inner
    return None


def _params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [param for group in optimizer.param_groups for param in group["params"]]


class GradResetTracker:
    """Counts, per optimizer step, the parameters whose gradients carried over un-reset."""

    def __init__(self) -> None:
        # id(param) -> (weak ref to its grad after the last optimizer step, grad version then)
        self._after: dict[int, tuple[weakref.ref, int]] = {}
        self._accumulations: dict[int, int] = {}  # id(param) -> backwards into it since then
        # id(param) -> its grad's version as the first of those backwards started (absent: it had no grad then)
        self._first_versions: dict[int, int] = {}

    def accumulated(self, params: Iterable[torch.Tensor]) -> None:
        """A backward that accumulates gradients into ``params`` starts."""
        counts, firsts = self._accumulations, self._first_versions
        for param in params:
            key = id(param)
            count = counts.get(key, 0)
            if not count and (grad := param.grad) is not None:
                firsts[key] = grad._version
            counts[key] = count + 1

    def reached(self, param: torch.Tensor) -> bool:
        """Whether a backward since the last optimizer step of ``param`` (that the tracker saw) reached it."""
        return id(param) in self._accumulations

    def before_step(self, optimizer: torch.optim.Optimizer) -> int:
        """How many of the optimizer's gradients were not reset since its previous step."""
        if not self._after or not self._accumulations:  # a first step, or no backward since the last one
            return 0
        stale = 0
        after, accumulations, firsts = self._after, self._accumulations, self._first_versions
        for param in _params(optimizer):
            grad = param.grad
            seen = after.get(id(param))
            if seen is None or seen[0]() is not grad or grad is None:  # (None last: mypy narrows on `is`)
                continue
            if accumulations.get(id(param)) and firsts.get(id(param)) == seen[1]:
                stale += 1  # untouched from the last step to the first backward since: no zero_grad() between
        return stale

    def after_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Note each gradient and its version now (a weak reference is made again only for a new tensor)."""
        after, accumulations = self._after, self._accumulations
        for param in _params(optimizer):
            key = id(param)
            accumulations.pop(key, None)
            self._first_versions.pop(key, None)
            grad = param.grad
            if grad is None:
                after.pop(key, None)
                continue
            version = grad._version
            seen = after.get(key)
            if seen is None or seen[0]() is not grad:
                after[key] = (weakref.ref(grad), version)
            elif seen[1] != version:
                after[key] = (seen[0], version)


class OptimizerHooks:
    """Installs a global pre-step hook (unless None) and post-step hook; ``remove()`` takes them away."""

    def __init__(self, before: Hook | None, after: Hook) -> None:
        self._handles: list[Any] = [register_optimizer_step_post_hook(after)]
        if before is not None:
            self._handles.append(register_optimizer_step_pre_hook(before))

    def remove(self) -> None:
        while self._handles:
            self._handles.pop().remove()


class OptimizerSteps:
    """The optimizer steps a session saw: each optimizer (weakly), the line of its last ``step()`` and the step it
    ran in.  An in-place update of parameters that a graph saved is what an ``optimizer.step()`` between a
    forward and its backward does."""

    def __init__(self) -> None:
        self._last: dict[int, list[Any]] = {}  # id(optimizer) -> [ref, site, step], updated in place

    def stepped(self, optimizer: torch.optim.Optimizer, site: int | None, step: int) -> None:
        """``optimizer.step()`` at ``site`` just updated its parameters in place, in step ``step``."""
        known = self._last.get(id(optimizer))
        if known is not None and known[0]() is optimizer:  # (the same optimizer: updated in place, every step)
            known[1], known[2] = site, step
        else:
            self._last[id(optimizer)] = [weakref.ref(optimizer), site, step]

    def parameters(self, optimizers: list[torch.optim.Optimizer] | None = None) -> set[int]:
        """``id()`` of every parameter of ``optimizers`` (default: of those that stepped so far)."""
        if optimizers is None:
            optimizers = [o for ref, _, _ in self._last.values() if (o := ref()) is not None]
        return {id(p) for optimizer in optimizers for p in _params(optimizer)}

    def updating(self, data_ptr: int, since: int) -> tuple[torch.optim.Optimizer, int | None] | None:
        """(the optimizer, the site of its last ``step()``) of an optimizer holding the parameter whose storage
        starts at ``data_ptr`` that stepped in step ``since`` or later (None: none did)."""
        for ref, site, step in self._last.values():
            optimizer = ref()
            if optimizer is None or step < since:
                continue
            if any(p.data_ptr() == data_ptr for p in _params(optimizer)):
                return optimizer, site
        return None
