"""Which optimizer owns which parameters, and which optimizer steps after a backward.

Read at an error only (never per op): the optimizers the user's frames hold
(locals, globals, ``self``'s attributes, one level into lists, dicts and
objects of the user's own classes), the one whose ``step(closure)`` is on the
stack, and, for a backward that failed before any optimizer stepped after it,
the first ``<optimizer>.step()`` (or ``scaler.step(<optimizer>)``) that the
syntax tree of the running function puts after the backward's line.

Example::

    >>> import sys, torch
    >>> from graphwatch.capture.causes.ownership import optimizers_in_frames
    >>> w = torch.nn.Parameter(torch.ones(1))
    >>> opt = torch.optim.SGD([w], lr=0.1)
    >>> [name for name, _ in optimizers_in_frames(sys._getframe()) if name == "opt"]
    ['opt']
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from types import FrameType
from typing import Any, cast

import torch

from ..hooks.optimizer import unwrapped
from ..lines.frames import local_value, named_values, resolve, user_frames
from ..lines.source import dotted_name, function_node
from .held_values import _of_a_user_class, attribute_items, first_items, key_text, sequence_items

_LIMIT = 64  # items looked at per container
Optimizer = torch.optim.Optimizer


def parameter_ids(optimizer: Optimizer) -> set[int]:
    """``id()`` of each parameter the optimizer updates."""
    return {id(p) for group in optimizer.param_groups for p in group["params"]}


def _optimizers_in(name: str, value: Any, depth: int = 0) -> Iterator[tuple[str, Optimizer]]:
    if issubclass(type(value), Optimizer):
        yield name, cast(Optimizer, unwrapped(value))  # (a wrapper is the optimizer it wraps: that one steps)
    elif depth >= 2 or issubclass(type(value), (str, bytes, torch.Tensor, torch.nn.Module)):
        return
    elif issubclass(type(value), (list, tuple)):
        for i, item in enumerate(sequence_items(value, _LIMIT)[1]):
            yield from _optimizers_in(f"{name}[{i}]", item, depth + 1)
    elif issubclass(type(value), dict):
        for key, item in first_items(value, _LIMIT):
            yield from _optimizers_in(f"{name}[{key_text(key)}]", item, depth + 1)
    elif _of_a_user_class(value) and not issubclass(type(value), type):  # (_of_a_user_class: it has a __dict__)
        for attr, item in attribute_items(value, _LIMIT):
            if not attr.startswith("__"):
                yield from _optimizers_in(f"{name}.{attr}", item, depth + 1)


def optimizers_in_frames(start: FrameType | None, limit: int = 8) -> list[tuple[str, Optimizer]]:
    """(name, optimizer) for each optimizer the innermost ``limit`` user frames reach, each optimizer once,
    under the name the innermost frame gives it."""
    found: dict[int, tuple[str, Optimizer]] = {}
    for frame in list(user_frames(start))[:limit]:
        for name, value in named_values(frame):
            for label, optimizer in _optimizers_in(name, value):
                found.setdefault(id(optimizer), (label, optimizer))
    return list(found.values())


def stepping_optimizer(start: FrameType | None) -> Optimizer | None:
    """The optimizer whose ``step(closure)`` is running on the stack (an LBFGS closure's backward), if any."""
    frame = start
    while frame is not None:
        if frame.f_code.co_name == "step":
            owner = local_value(frame, "self")
            if issubclass(type(owner), Optimizer):
                return owner
        frame = frame.f_back
    return None


def _step_calls(node: ast.AST) -> Iterator[tuple[int, list[str]]]:
    """(line, candidate dotted names) of each ``x.step(...)`` call under ``node``: ``x`` itself, and the
    first argument's name (``scaler.step(opt)``)."""
    for call in ast.walk(node):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "step":
            names = [dotted_name(call.func.value)]
            if call.args:
                names.append(dotted_name(call.args[0]))
            yield call.lineno, [n for n in names if n]


def optimizer_stepping_after(frame: FrameType, line: int) -> tuple[str, Optimizer] | None:
    """(name, optimizer) of the first ``<optimizer>.step()`` after ``line`` in the source of ``frame``'s
    function: inside the innermost loop holding ``line`` first, then anywhere after it."""
    tree = function_node(frame.f_code)
    if tree is None:
        return None
    loops = [n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.While, ast.AsyncFor))
             and n.lineno <= line <= (n.end_lineno or n.lineno)]  # fmt: skip
    scopes: list[ast.AST] = [max(loops, key=lambda n: n.lineno)] if loops else []
    for scope in [*scopes, tree]:
        for at, names in sorted(_step_calls(scope)):
            if at <= line:
                continue
            for name in names:
                value = resolve(frame, name)
                if issubclass(type(value), Optimizer):
                    return name, value
    return None


def owners(named: Iterable[tuple[str, Optimizer]]) -> dict[int, str]:
    """``id(parameter)`` -> the name of the optimizer that updates it (the first one named)."""
    owned: dict[int, str] = {}
    for name, optimizer in named:
        for param in parameter_ids(optimizer):
            owned.setdefault(param, name)
    return owned
