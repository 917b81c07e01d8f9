"""Read the user's source as syntax: the function a code object runs, and dotted names in it.

graphwatch reads source only where a decision needs it (where a loop's step
ends, which variable carries a graph, which line appends to a holder), once
per file, through :mod:`linecache` (so notebooks and ``python -c`` work too).

Example::

    >>> import ast
    >>> from graphwatch.capture.source import dotted_name, function_node
    >>> def train():
    ...     pass
    >>> function_node(train.__code__).name, dotted_name(ast.parse("self.opt.step").body[0].value)
    ('train', 'self.opt.step')
"""

from __future__ import annotations

import ast
import functools
import linecache
import os
from collections.abc import Iterator
from types import CodeType


def dotted_name(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of attributes on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _source_tree(filename: str) -> ast.Module | None:
    """The file's syntax tree, read again when the file changed (a module edited and reloaded)."""
    try:
        stat = os.stat(filename)
        version: tuple[float, int] | None = (stat.st_mtime, stat.st_size)
    except OSError:  # not a file: a notebook cell or <string>, as linecache has it
        version = None
    return _parse(filename, version)


@functools.lru_cache(maxsize=256)
def _parse(filename: str, version: tuple[float, int] | None) -> ast.Module | None:
    linecache.checkcache(filename)
    try:
        return ast.parse("".join(linecache.getlines(filename)) or "\x00", filename)
    except (SyntaxError, ValueError):
        return None


def module_node(filename: str) -> ast.Module | None:
    """The syntax tree of a whole file (None when it cannot be read)."""
    return _source_tree(filename)


def function_node(code: CodeType) -> ast.AST | None:
    """The AST of ``code``'s function (the module itself for module code), or None without source."""
    tree = _source_tree(code.co_filename)
    if tree is None or code.co_name == "<module>":
        return tree
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == code.co_name:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if first == code.co_firstlineno:
                return node
    return None


def assignments(node: ast.AST, name: str) -> Iterator[tuple[int, bool]]:
    """(line, grows) for each statement under ``node`` that binds the dotted ``name`` or adds to it:
    ``name = ...`` (also as one target of a tuple), ``name += ...``, ``name.append(...)``/``extend``."""
    for statement in ast.walk(node):
        if isinstance(statement, (ast.Assign, ast.AnnAssign)):
            targets: list[ast.expr] = (
                list(statement.targets) if isinstance(statement, ast.Assign) else [statement.target]
            )
            if any(dotted_name(t) == name for t in _flat(targets)):
                yield statement.lineno, False
        elif isinstance(statement, ast.AugAssign) and dotted_name(statement.target) == name:
            yield statement.lineno, True
        elif (
            isinstance(statement, ast.Call)
            and isinstance(statement.func, ast.Attribute)
            and statement.func.attr in ("append", "extend", "add_")
            and dotted_name(statement.func.value) == name
        ):
            yield statement.lineno, True


def assigned_names(source: str) -> list[str]:
    """The dotted names one line of code assigns, in its order (also as parts of a tuple), or [].

    >>> assigned_names("out, self.hidden = self.lstm(x, self.hidden)  # carried"), assigned_names("f(x)")
    (['out', 'self.hidden'], [])
    """
    try:
        body = ast.parse(source.strip()).body
    except SyntaxError:
        return []
    if len(body) != 1 or not isinstance(body[0], (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        return []
    statement = body[0]
    targets: list[ast.expr] = list(statement.targets) if isinstance(statement, ast.Assign) else [statement.target]
    flat = sorted(_flat(targets), key=lambda t: (t.lineno, t.col_offset))
    return [name for name in map(dotted_name, flat) if name is not None]


def _flat(targets: list[ast.expr]) -> Iterator[ast.expr]:
    stack = list(targets)
    while stack:
        target = stack.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            stack.extend(target.elts)
        else:
            yield target
