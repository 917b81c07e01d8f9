"""The tensors with a graph that a Python value holds, each named by the path a user would type to reach it.

From a root the user's code knows (a variable, ``self``, a module) down to the tensor: ``total_loss``,
``losses[3]``, ``buffer[3][1]`` (a tuple kept in a list), ``meters['loss'].sum`` (an attribute of an object of
the user's own class kept in a dict), ``policy._moving_avg`` (a private attribute of such an object),
``model.outputs[7]``.  A hook registered on a module keeps what its closure holds: the list a forward hook
appends activations to is named as the hook's code spells it (:func:`hook_closures`).

Example::

    >>> import torch
    >>> loss = torch.ones(1, requires_grad=True) * 2
    >>> [name for name, _ in tensors_in("buffer", [(torch.zeros(1), loss)])]
    ['buffer[0][1]']
"""

from __future__ import annotations

import ast
import os
import re
import sys
import types
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from operator import itemgetter
from types import FrameType
from typing import Any

import torch

from ..lines.callsite import is_user_file
from ..lines.frames import resolve

_CONTAINER_LIMIT = 64  # items looked at per list/tuple/dict
_CONTAINER_LEVELS = 2  # containers looked into, one inside the other: a replay buffer's tuples, not deeper
_OBJECT_LEVELS = 2  # objects of the user's classes looked into: a trainer's policy's attributes, not deeper
_SECOND = itemgetter(1)  # a pair's second: a dict item's value
_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_SEQUENCES = (list, tuple, deque)  # a deque: the usual replay buffer
# what every nn.Module holds of torch's own (its parameters, buffers, submodules and hooks are read by their own
# means): a module's other attributes, private ones too (a LightningModule's `self._losses`), are looked into
_MODULE_INTERNALS = frozenset(vars(torch.nn.Module()))


# Exact types whose values hold no tensor and are never looked into: not a tensor, container or module, and
# (static types, so no instance can have a ``__dict__``) never of a user class.  Skipped before anything else.
_INERT = frozenset({
    types.NoneType, bool, int, float, complex, str, bytes, bytearray, range, slice, set, frozenset, property,
    types.EllipsisType, types.NotImplementedType, types.CodeType, types.BuiltinFunctionType, types.MethodWrapperType,
    types.WrapperDescriptorType, types.MethodDescriptorType, types.ClassMethodDescriptorType,
    types.GetSetDescriptorType, types.MemberDescriptorType,
})


def tensors_in(
    name: str, value: Any, objects: int = _OBJECT_LEVELS, containers: int = _CONTAINER_LEVELS
) -> Iterator[tuple[str, torch.Tensor]]:
    """(path, tensor) for the tensors with a graph ``value`` holds: itself, the items of a list or tuple (the
    last 64) or dict (the first 64) and what they hold (``containers`` levels of them), the attributes of an
    ``nn.Module``'s submodules and of objects of the user's classes, private ones too (``objects`` levels of
    them), in the order of a walk that looks into each value before its next sibling.  Of a value's own code
    only a tensor's ``grad_fn`` and a module's ``named_modules`` are asked: kinds are told by type, containers
    read by their base types' methods (:func:`first_items`, :func:`sequence_items`, :func:`attribute_items`),
    keys spelled by :func:`key_text`, and only in the path of a tensor found (a census meets many values that
    hold none: one loop, no path built for them)."""
    return iter(_walk(name, value, objects, containers, {}))


def _walk(name: str, value: Any, objects: int, containers: int, files: dict[str, bool]) -> list[tuple[str, torch.Tensor]]:
    """:func:`tensors_in`, as a list (``files``: :func:`_is_users_file`'s answers for this look)."""
    found: list[tuple[str, torch.Tensor]] = []
    stack: list[tuple[Any, Any, int, int]] = [(value, name, objects, containers)]
    pop, push = stack.pop, stack.extend
    while stack:
        value, path, objects, containers = pop()
        kind = type(value)
        if issubclass(kind, torch.Tensor):
            if value.grad_fn is not None:
                found.append((_spelled(path), value))
            continue
        if issubclass(kind, _SEQUENCES):
            if containers > 0:
                first, items = sequence_items(value, last=True)
                if _INERT.issuperset(map(type, items)):  # (numbers, strings: told at C speed, the usual list)
                    continue
                inside: list[tuple[Any, Any, int, int]] = [
                    (item, (path, i, False), objects, containers - 1)
                    for i, item in enumerate(items, first) if type(item) not in _INERT
                ]  # fmt: skip
                push(reversed(inside))
        elif issubclass(kind, dict):
            if containers > 0:
                items = first_items(value)
                if _INERT.issuperset(map(type, map(_SECOND, items))):
                    continue
                inside = [
                    (item, (path, key, False), objects, containers - 1) for key, item in items if type(item) not in _INERT
                ]  # fmt: skip
                push(reversed(inside))
        elif issubclass(kind, torch.nn.Module):
            push(reversed(_module_values(_spelled(path), value, objects, containers)))
        elif kind is types.FunctionType and not value.__dict__:  # (the usual function: no attribute to look into;
            continue  # a module's or class's hundreds of them, told apart without asking whose file they are in)
        elif objects > 0 and _of_a_user_class(value, files):  # a meter's sum, a policy's _moving_avg, a trainer's self.losses
            inside = [
                (item, (path, attr, True), objects - 1, containers)
                for attr, item in attribute_items(value) if not attr.startswith("__") and type(item) not in _INERT
            ]  # fmt: skip
            push(reversed(inside))
    return found


def _module_values(name: str, module: torch.nn.Module, objects: int, containers: int) -> list[tuple[Any, str, int, int]]:
    """What :func:`tensors_in` looks into of a module named ``name``, in order: for each of its submodules, its
    public attributes that are not modules (a list kept on ``self`` too), its buffers (a running statistic
    updated outside ``no_grad``), its parameters with a graph (a parameter updated in place outside ``no_grad``)."""
    inside: list[tuple[Any, str, int, int]] = []
    for module_name, submodule in list(module.named_modules(prefix=name)):
        for attr, item in list(vars(submodule).items()):
            if (
                attr not in _MODULE_INTERNALS and not attr.startswith("__") and type(item) not in _INERT
                and not issubclass(type(item), torch.nn.Module)
            ):  # fmt: skip
                inside.append((item, f"{module_name}.{attr}", objects - 1, containers))
        for attr, buffer in list(submodule._buffers.items()):
            if buffer is not None:
                inside.append((buffer, f"{module_name}.{attr}", _OBJECT_LEVELS, _CONTAINER_LEVELS))
        for attr, param in list(submodule._parameters.items()):
            if param is not None and param.grad_fn is not None:
                inside.append((param, f"{name}.parameters()[{f'{module_name}.{attr}'[len(name) + 1:]}]", 0, 0))
    return inside


def _spelled(path: Any) -> str:
    """The text of a path of :func:`tensors_in`: ``losses[3].sum``, ``meters['loss']``."""
    pieces = []
    while type(path) is tuple:
        path, piece, attribute = path
        pieces.append(f".{piece}" if attribute else f"[{key_text(piece)}]")
    pieces.append(path)
    return "".join(reversed(pieces))


def first_items(mapping: Any, limit: int | None = _CONTAINER_LIMIT) -> list[tuple[Any, Any]]:
    """The first ``limit`` (key, value) pairs of a dict (or of a class's mapping proxy), read at once by the dict's
    own method: the user's code cannot change the dict while they are looked at (a tracer counting into it,
    another thread), a subclass's ``items()`` is not called, and a huge dict is not copied whole.

    >>> first_items({"a": 1, "b": 2, "c": 3}, limit=2)
    [('a', 1), ('b', 2)]
    """
    items = dict.items(mapping) if issubclass(type(mapping), dict) else mapping.items()
    return list(islice(items, limit))


def sequence_items(
    sequence: list | tuple | deque, limit: int = _CONTAINER_LIMIT, last: bool = False
) -> tuple[int, Sequence[Any]]:
    """(the index of the first, the items) of the first (or ``last``) ``limit`` items of a list, tuple or deque,
    read by its base type's own methods: a subclass's ``__len__`` or ``__getitem__`` is not called.

    >>> sequence_items(list(range(100)), limit=3), sequence_items(tuple(range(100)), limit=2, last=True)
    ((0, [0, 1, 2]), (98, (98, 99)))
    >>> sequence_items(deque(range(100), maxlen=50), limit=2, last=True)
    (48, [98, 99])
    """
    kind = type(sequence)
    base: Any = list if issubclass(kind, list) else deque if issubclass(kind, deque) else tuple
    first = max(base.__len__(sequence) - limit, 0) if last else 0
    if base is not deque:
        return first, base.__getitem__(sequence, slice(first, first + limit))
    try:  # (no slices: item by item, near its end, as fast as near its start)
        held: Any = sequence
        return first, [deque.__getitem__(held, i) for i in range(first, min(first + limit, deque.__len__(held)))]
    except IndexError:  # another thread emptied it meanwhile
        return 0, []


def attribute_items(value: Any, limit: int | None = _CONTAINER_LIMIT) -> list[tuple[str, Any]]:
    """The first ``limit`` (None: all) attributes of an object (its ``__dict__``'s items, read at once), or none
    where reading them raises (a proxy's ``__dict__`` property whose target is gone, an object with no
    ``__dict__``): that must not break the user's loop.

    >>> class Meter:
    ...     def __init__(self):
    ...         self.sum, self.count = 0.0, 0
    >>> attribute_items(Meter())
    [('sum', 0.0), ('count', 0)]
    """
    try:
        return first_items(vars(value), limit)
    except Exception:
        return []


def key_text(key: Any) -> str:
    """A dict key as a path spells it: its ``repr``, or ``<its type>`` where the user's ``__repr__`` fails (that
    must not break their loop).

    >>> class Broken:
    ...     def __repr__(self):
    ...         raise ValueError
    >>> key_text("loss"), key_text(Broken())
    ("'loss'", '<Broken>')
    """
    try:
        return repr(key)
    except Exception:
        return f"<{type(key).__name__}>"


def tensors_among(names: Iterable[tuple[str, Any]]) -> list[tuple[str, torch.Tensor]]:
    """:func:`tensors_in` of each (name, value) whose name is not a dunder."""
    files: dict[str, bool] = {}
    return [
        pair for name, value in names if type(value) not in _INERT and not name.startswith("__")
        for pair in _walk(name, value, _OBJECT_LEVELS, _CONTAINER_LEVELS, files)
    ]  # fmt: skip


def hook_closures(values: Iterable[Any]) -> Iterator[tuple[types.FunctionType, list[tuple[str, torch.Tensor]]]]:
    """(hook's function, the (path, tensor) pairs it holds) for each hook of the user's own code registered on the
    modules ``values`` are or hold as submodules, that holds a tensor with a graph: a forward hook's
    ``activations.append(output)`` keeps every step's activations, the path spelled as the hook's code spells
    the variable (``activations[3]``; ``self.activations[3]`` for a bound method's object, :func:`_hook_values`)."""
    seen: set[int] = set()
    for value in values:
        if not issubclass(type(value), torch.nn.Module):
            continue
        for module in value.modules():
            hooks = [hook for attr in _HOOKS for hook in getattr(module, attr, {}).values()]
            for hook in hooks:
                function = hook.__func__ if isinstance(hook, types.MethodType) else hook
                if not isinstance(function, types.FunctionType) or id(hook) in seen:
                    continue
                seen.add(id(hook))
                if _is_users_file(function.__code__.co_filename):
                    pairs = tensors_among(_hook_values(hook, function))
                    if pairs:
                        yield function, pairs


def _hook_values(hook: Any, function: types.FunctionType) -> list[tuple[str, Any]]:
    """(the name the hook's code reads it by, the value) of what a hook holds: the filled cells of its closure,
    and for a method bound to an object that is not a module (a Lightning ``Callback``'s ``self._keep``) that
    object, by the name of its first parameter (``self``: ``self.activations[3]``); a module's own attributes
    are looked into where the frames hold the module, and named as they spell it."""
    values = list(_cell_values(function))
    bound = getattr(hook, "__self__", None) if hook is not function else None
    if bound is not None and not issubclass(type(bound), torch.nn.Module) and function.__code__.co_argcount:
        values.append((function.__code__.co_varnames[0], bound))
    return values


def _cell_values(function: types.FunctionType) -> Iterator[tuple[str, Any]]:
    """(the name the function's code reads it by, the value) of each filled cell of its closure."""
    for name, cell in zip(function.__code__.co_freevars, function.__closure__ or ()):
        try:
            yield name, cell.cell_contents
        except ValueError:  # a cell not filled yet
            continue


def value_at(frame: FrameType | None, path: str, names: dict | None) -> Any:
    """The value a path of names, attributes and literal keys of lists, tuples and dicts leads to (``meters['loss']``)
    from ``frame`` (or else ``names``), or None; nothing of the user's is called but the attributes read.  A
    numbered submodule (``model.1.running_mean``, as a module names a Sequential's children) is that attribute."""
    path = re.sub(r"\.(\d+)(?=[.\[]|$)", r"['\1']", path)  # model['1'].running_mean: read as model.1 below
    try:
        node: ast.expr = ast.parse(path, mode="eval").body
    except SyntaxError:
        return None
    steps: list[ast.expr] = []
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        steps.append(node)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    value = resolve(frame, node.id, names)
    for step in reversed(steps):
        if isinstance(step, ast.Attribute):
            try:
                value = getattr(value, step.attr, None)
            except Exception:  # a property of the user's that raises: no value (and no error in their run)
                return None
        elif isinstance(step, ast.Subscript) and isinstance(value, torch.nn.Module):  # a numbered submodule
            key = step.slice.value if isinstance(step.slice, ast.Constant) else None
            value = value._modules.get(key) if isinstance(key, str) else None
        elif isinstance(step, ast.Subscript) and isinstance(value, (list, tuple, dict)):
            try:
                value = value[ast.literal_eval(step.slice)]
            except (ValueError, KeyError, IndexError, TypeError):
                return None
        else:
            return None
    return value


def _of_a_user_class(value: Any, files: dict[str, bool] | None = None) -> bool:
    """Whether ``value`` is an instance (with attributes) of a class the user's own code defines; a module,
    class or function (whose type is a builtin) counts when its own module's file is the user's (``files``:
    :func:`_is_users_file`'s answers for one look at many values)."""
    kind = type(value)
    if kind is types.ModuleType:
        module = value
    elif kind is type or kind is types.FunctionType:
        module = sys.modules.get(getattr(value, "__module__", None) or "")
    else:
        module = sys.modules.get(kind.__module__)
    name = getattr(module, "__name__", None)  # (sys.modules may hold any object)
    if isinstance(name, str) and name in _BUILTIN_MODULES:  # sys, gc, time: no file, never the user's
        return False
    filename = getattr(module, "__file__", None) or ""  # none: __main__ in a notebook or with python -c
    if not _is_users_file(filename, files):
        return False
    try:
        return hasattr(value, "__dict__")
    except Exception:  # a proxy's ``__dict__`` property that raises: not looked into (nor their loop broken)
        return False


def _is_users_file(filename: str, files: dict[str, bool] | None = None) -> bool:
    """Whether a module's ``filename`` is the user's: not torch's, graphwatch's, the standard library's or an
    installed package's.  Kept per name, unless the answer depends on the working directory (a name that is
    not its own absolute path: a relative one, or none, as ``__main__``'s in a notebook); that answer is kept in
    ``files`` (one look at many values, in one working directory), when given."""
    known = _USERS_FILES.get(filename)
    if known is None and files is not None:
        known = files.get(filename)
    if known is not None:
        return known
    users = is_user_file(filename) and "-packages" not in filename
    if filename.startswith("<") or os.path.abspath(filename) == filename:
        if len(_USERS_FILES) >= _USERS_FILES_LIMIT:
            _USERS_FILES.clear()
        _USERS_FILES[filename] = users
    elif files is not None:
        files[filename] = users
    return users


_BUILTIN_MODULES = frozenset(sys.builtin_module_names)
_USERS_FILES: dict[str, bool] = {}
_USERS_FILES_LIMIT = 4096
