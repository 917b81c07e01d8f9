"""Where an object keeps a tensor as an attribute: the one line of its class that stores it.

A loss module that keeps its target (``self.target = target`` in ``__init__``) holds a tensor made on
another line (``content = ContentLoss(features(content_img))``).  The fix belongs at the store, on the
object, as the class spells it: ``self.target = target.detach()``.  The store is named only when it is
certain: the one statement of the methods of the object's own classes (its user-code bases too) that assigns
``self.<attr>``, and it is in ``__init__``, which ran when the object was made.  An attribute that any other
method assigns, or that several statements assign, has no one store.  A buffer no statement assigns (made by
``register_buffer``) that one statement changes in place outside ``no_grad`` (an EMA) is kept at that
statement (:func:`update_site`).

Example::

    >>> class Kept:
    ...     def __init__(self, target):
    ...         self.target = target
    >>> store = attribute_store(Kept(1), "target")
    >>> store is not None and store[0].co_name
    '__init__'
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from types import CodeType, FrameType
from typing import Any

from ..lines.callsite import SiteTable, is_user_file
from ..lines.frames import resolve
from ..lines.source import assignments, function_node, inplace_updates, module_node


def attribute_store(owner: Any, attr: str) -> tuple[CodeType, int] | None:
    """(the code of ``__init__``, the line) of the one statement of ``owner``'s classes that assigns
    ``self.<attr>``; None when no such statement, several, or one outside ``__init__``."""
    stores = self_stores(owner, attr)
    if len(stores) != 1 or stores[0][0].co_name != "__init__":
        return None
    return stores[0]


def self_stores(owner: Any, attr: str) -> list[tuple[CodeType, int]]:
    """(code, line) of every statement of ``owner``'s classes (the user's, bases included, in method order)
    that assigns ``self.<attr>``."""
    return [(code, line) for code in _user_methods(type(owner)) for line in _self_stores(code, attr)]


def _user_methods(cls: type) -> Iterator[CodeType]:
    """The code of each function defined by ``cls`` and its bases whose file is the user's: methods, and the
    functions behind properties (getter, setter, deleter), ``functools.cached_property``, ``staticmethod`` and
    ``classmethod`` (a property that caches ``self._x`` stores it as surely as a method does)."""
    for klass in cls.__mro__:
        for member in vars(klass).values():
            for function in _functions_of(member):
                code = getattr(function, "__code__", None)
                if isinstance(code, CodeType) and is_user_file(code.co_filename):
                    yield code


def _functions_of(member: Any) -> tuple[Any, ...]:
    """The functions a class member runs: itself, or what a descriptor wraps."""
    if isinstance(member, property):
        return (member.fget, member.fset, member.fdel)
    if isinstance(member, (staticmethod, classmethod)):
        return (member.__func__,)
    wrapped = getattr(member, "func", None)  # functools.cached_property, functools.partialmethod
    return (member,) if wrapped is None else (member, wrapped)


def _self_stores(code: CodeType, attr: str) -> list[int]:
    """The lines of ``code``'s function that assign ``<its first argument>.<attr>``."""
    node = function_node(code)
    if node is None or not code.co_argcount:
        return []
    return [line for line, _ in assignments(node, f"{code.co_varnames[0]}.{attr}")]


def store_site(sites: SiteTable, frame: FrameType, name: str) -> int | None:
    """The site of :func:`attribute_store` for ``name`` (``content.target``: ``content`` a variable of
    ``frame``), or None."""
    head, _, attr = name.partition(".")
    if not attr or not head.isidentifier() or not attr.isidentifier():
        return None
    owner = resolve(frame, head)
    store = attribute_store(owner, attr) if owner is not None else None
    return sites.from_code(*store) if store is not None else None


def update_site(sites: SiteTable, owner: Any, attr: str) -> int | None:
    """The line that changes ``owner``'s attribute ``attr`` in place outside ``no_grad``: the one statement of
    its classes that changes ``self.<attr>``, else the one statement of its class's file that changes some
    ``<name>.<attr>`` (a Lightning ``Callback``'s ``pl_module.ema_w.mul_(0.99).add_(w)``); None when there is
    none, or more than one (no line is guessed)."""
    if owner is None:
        return None
    found = {
        (code, line)
        for code in _user_methods(type(owner))
        for line, changed in inplace_updates(function_node(code)) if changed == f"self.{attr}"
    }  # fmt: skip
    if found:
        return sites.from_code(*found.pop()) if len(found) == 1 else None
    filename = next((code.co_filename for code in _user_methods(type(owner))), None)  # (its own class's first)
    tree = module_node(filename) if filename is not None else None
    if filename is None or tree is None:
        return None
    functions = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    lines = {line for node in functions for line, changed in inplace_updates(node) if changed.endswith(f".{attr}")}
    return sites.from_file(filename, lines.pop()) if len(lines) == 1 else None
