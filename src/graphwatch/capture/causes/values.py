"""What a value the loop carries was when it ran: its type (a tensor, a tuple of tensors, a list of per-layer
tuples) and whether the code that holds it sets it to None (a state that starts as None).  A fix detaches
the value by these, never by its name.

Example::

    >>> import torch
    >>> from graphwatch.capture.causes.values import runtime_type
    >>> runtime_type(torch.zeros(2)), runtime_type((torch.zeros(1), torch.zeros(1)))
    ('Tensor', 'tuple[Tensor]')
"""

from __future__ import annotations

import ast
from types import CodeType, FrameType
from typing import Any

import torch

from ..lines.frames import local_value
from ..lines.source import dotted_name, function_node

_CONTAINER_LIMIT = 64  # items looked at per list or tuple


def runtime_type(value: Any, levels: int = 3) -> str:
    """The type of a value as it ran, as :data:`~graphwatch.model.VALUE_TYPES` names it: ``"Tensor"``,
    ``"tuple[Tensor]"`` (an LSTM's ``(h, c)``), ``"list[tuple[Tensor]]"``, else ``"other"`` (a namedtuple, a
    dict, mixed items, nested deeper than ``levels``).

    >>> import torch
    >>> runtime_type((torch.zeros(1), torch.zeros(1))), runtime_type([(torch.zeros(1),)]), runtime_type((1, None))
    ('tuple[Tensor]', 'list[tuple[Tensor]]', 'other')
    """
    if isinstance(value, torch.Tensor):
        return "Tensor"
    if type(value) in (tuple, list) and value and levels > 1:
        inner = {runtime_type(item, levels - 1) for item in value[:_CONTAINER_LIMIT]}
        if len(inner) == 1 and "other" not in inner:
            return f"{type(value).__name__}[{inner.pop()}]"
    return "other"


def set_to_none(frame: FrameType, name: str) -> bool:
    """Whether the code that holds ``name`` sets it to None (a state that starts as None): ``name = None`` or a
    parameter defaulting to None in the frame's function, ``self.attr = None`` in a method of the class of the
    object ``name`` is an attribute of (``module.hidden``, ``self.hidden``)."""
    head, _, rest = name.partition(".")
    if not rest:
        node = function_node(frame.f_code)
        return node is not None and _sets_none(node, name)
    owner = local_value(frame, head) if head in frame.f_code.co_varnames else frame.f_globals.get(head)
    *path, attr = rest.split(".")
    for part in path:
        owner = getattr(owner, part, None)
    for cls in type(owner).__mro__:
        if cls.__module__.startswith(("torch.", "lightning", "builtins")):
            break
        for function in vars(cls).values():
            code = getattr(function, "__code__", None)
            node = function_node(code) if isinstance(code, CodeType) else None
            if node is not None and _sets_none(node, f"self.{attr}"):
                return True
    return False


def _sets_none(node: ast.AST, name: str) -> bool:
    for statement in ast.walk(node):
        if isinstance(statement, ast.Assign):
            targets = [dotted_name(t) for t in statement.targets]
        elif isinstance(statement, ast.AnnAssign):
            targets = [dotted_name(statement.target)]
        else:
            continue
        value = statement.value
        if name in targets and isinstance(value, ast.Constant) and value.value is None:
            return True
    arguments = getattr(node, "args", None)
    if isinstance(arguments, ast.arguments):
        positional = [*arguments.posonlyargs, *arguments.args]
        pairs = [*zip(positional[len(positional) - len(arguments.defaults) :], arguments.defaults),
                 *zip(arguments.kwonlyargs, arguments.kw_defaults)]  # fmt: skip
        return any(a.arg == name and isinstance(d, ast.Constant) and d.value is None for a, d in pairs)
    return False
