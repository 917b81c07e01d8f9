"""Read the user's source as syntax: the function a code object runs, and dotted names in it.

graphwatch reads source only where a decision needs it (where a loop's step
ends, which variable carries a graph, which line appends to a holder), once
per file, through :mod:`linecache` (so notebooks and ``python -c`` work too).

Example::

    >>> import ast
    >>> from graphwatch.capture.lines.source import dotted_name, function_node
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
import weakref
from collections.abc import Callable, Iterator
from types import CodeType

from ...cells import cell_lines
from ...model import SourceLines, Trace
from ...model.source_lines import CONTEXT_LINES, MAX_LINE_CHARS, parse_where


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


def held_path(node: ast.expr) -> str | None:
    """A chain of attributes and literal subscripts on a name as a holder's path spells it (keys by their
    ``repr``): ``history['loss']``, ``self.meters[0].values``; else None.

    >>> held_path(ast.parse('history["loss"]', mode="eval").body), held_path(ast.parse("f(x).y", mode="eval").body)
    ("history['loss']", None)
    """
    parts = []
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Attribute):
            parts.append(f".{node.attr}")
        elif isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, (str, int)):
            parts.append(f"[{node.slice.value!r}]")
        else:
            return None
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return node.id + "".join(reversed(parts))


def kept_in(source: str) -> str | None:
    """The path of what one line of code keeps its value in: what it appends or adds to (``.append``,
    ``.extend``, ``.add_``, ``+=``) or assigns (one target), as :func:`held_path` spells it; else None.

    >>> kept_in('history["loss"].append(loss)  # every step'), kept_in("running['loss'] += loss"), kept_in("f(x)")
    ("history['loss']", "running['loss']", None)
    """
    try:
        body = ast.parse(source.strip()).body
    except SyntaxError:
        return None
    statement = body[0] if len(body) == 1 else None
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
        func = statement.value.func
        if isinstance(func, ast.Attribute) and func.attr in _ADDING:
            return held_path(func.value)
    if isinstance(statement, (ast.AugAssign, ast.AnnAssign)):
        return held_path(statement.target)
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
        return held_path(statement.targets[0])
    return None


_ADDING = ("append", "extend", "add_")  # the methods that add a value to what they are called on


def inplace_statement(statement: ast.stmt) -> str | None:
    """The name a statement changes in place: ``t[...] = v``, ``t.op_(...)`` (also ``t.mul_(a).add_(b)``),
    ``t += v``; else None.

    >>> code = "att[:, 0] = 0\\nx.mul_(2).add_(y)\\ny = x + 1\\nx += 2\\nw.requires_grad_(False)"
    >>> [inplace_statement(s) for s in ast.parse(code).body]
    ['att', 'x', None, 'x', None]
    """
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Subscript):
        return dotted_name(statement.targets[0].value)
    if isinstance(statement, ast.AugAssign):
        return dotted_name(statement.target)
    if isinstance(statement, ast.Expr) and inplace_call(statement.value):
        receiver = statement.value
        while isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Attribute) and inplace_call(receiver):
            receiver = receiver.func.value  # (each call of the chain changes what the one before it returned)
        return dotted_name(receiver)
    return None


_NO_GRAD = {"no_grad", "inference_mode"}


def is_no_grad(expression: ast.expr) -> bool:
    """``torch.no_grad()``, ``no_grad()``, ``torch.inference_mode()`` (also without the call)."""
    target = expression.func if isinstance(expression, ast.Call) else expression
    name = dotted_name(target) or ""
    return name.rsplit(".", 1)[-1] in _NO_GRAD


def inplace_updates(tree: ast.AST | None) -> list[tuple[int, str]]:
    """(line, name) of each statement of a function's (or a module's) syntax ``tree`` that changes a name in
    place outside a ``with torch.no_grad():`` (or ``inference_mode``) block, in line order: where a tensor that
    requires no grad can join a graph (an EMA teacher's ``tp.mul_(m).add_((1 - m) * sp)``).

    >>> def ema(teacher, student):
    ...     for tp, sp in zip(teacher, student):
    ...         tp.mul_(0.9).add_(0.1 * sp)
    ...     with torch.no_grad():
    ...         teacher[0] += 1
    >>> [name for _, name in inplace_updates(function_node(ema.__code__))]
    ['tp']
    """
    outside_no_grad = own_statements(tree, skip=lambda s: isinstance(s, (ast.With, ast.AsyncWith)) and any(
        is_no_grad(item.context_expr) for item in s.items
    ))  # fmt: skip
    return sorted((s.lineno, name) for s in outside_no_grad if (name := inplace_statement(s)) is not None)


def own_statements(scope: ast.AST | None, skip: Callable[[ast.stmt], bool] = lambda s: False) -> Iterator[ast.stmt]:
    """The simple statements of ``scope`` itself (also inside its loops, branches and ``with`` blocks), not of
    the functions and classes it defines, nor of the blocks ``skip`` says to leave out.

    >>> tree = ast.parse("x = 1\\nfor i in y:\\n    z += i\\ndef f():\\n    w = 2")
    >>> sorted(s.lineno for s in own_statements(tree))
    [1, 3]
    """
    stack = list(getattr(scope, "body", [])) if scope is not None else []
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or skip(node):
            continue
        if not any(hasattr(node, block) for block in ("body", "handlers", "cases")):
            yield node
        for block in ("body", "orelse", "finalbody", "handlers", "cases"):  # (an except clause has a body too)
            stack.extend(getattr(node, block, None) or [])


def inplace_call(node: ast.expr) -> bool:
    """``x.op_(...)``: a call of a method whose name ends in one underscore, other than those that change no
    value (``requires_grad_``, ``detach_``, ``share_memory_``)."""
    func = node.func if isinstance(node, ast.Call) else None
    return (
        isinstance(func, ast.Attribute) and func.attr.endswith("_") and not func.attr.startswith("_")
        and func.attr not in _VALUE_KEEPING
    )  # fmt: skip


_VALUE_KEEPING = frozenset({"requires_grad_", "detach_", "share_memory_"})  # in-place in name only


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
    return _functions(tree).get((code.co_name, code.co_firstlineno))


# each syntax tree's function definitions, for as long as the tree is cached (``_parse``)
_FUNCTIONS: weakref.WeakKeyDictionary[ast.Module, dict[tuple[str, int], ast.AST]] = weakref.WeakKeyDictionary()


def _functions(tree: ast.Module) -> dict[tuple[str, int], ast.AST]:
    """The tree's function definitions by (name, first line of the code object: the first decorator's, if any),
    the first in ``ast.walk`` order where two share both: one walk of a file's tree, where a search per code
    object walked the whole file each time (tens of milliseconds in a file of ten thousand lines)."""
    functions = _FUNCTIONS.get(tree)
    if functions is None:
        functions = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                functions.setdefault((node.name, first), node)
        _FUNCTIONS[tree] = functions
    return functions


def innermost_function(tree: ast.Module, line: int) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The innermost function whose lines hold ``line`` (a site read from a file has no function name), from
    the tree's index of functions (:func:`function_node`'s), not a walk of the whole tree.

    >>> tree = ast.parse("def outer():\\n    def inner():\\n        return 1\\n    return inner\\n")
    >>> innermost_function(tree, 3).name, innermost_function(tree, 4).name, innermost_function(tree, 9)
    ('inner', 'outer', None)
    """
    holding = [f for f in _functions(tree).values() if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
               and f.lineno <= line <= (f.end_lineno or f.lineno)]  # fmt: skip
    return max(holding, key=lambda f: f.lineno, default=None)


def assignments(node: ast.AST, name: str) -> Iterator[tuple[int, bool]]:
    """(line, grows) for each statement under ``node`` that binds ``name`` (dotted, or a :func:`held_path`:
    ``history['loss']``) or adds to it: ``name = ...`` (also as one target of a tuple), ``name += ...``,
    ``name.append(...)``/``extend``."""
    for statement in ast.walk(node):
        if isinstance(statement, (ast.Assign, ast.AnnAssign)):
            targets: list[ast.expr] = (
                list(statement.targets) if isinstance(statement, ast.Assign) else [statement.target]
            )
            if any(held_path(t) == name for t in _flat(targets)):
                yield statement.lineno, False
        elif isinstance(statement, ast.AugAssign) and held_path(statement.target) == name:
            yield statement.lineno, True
        elif (
            isinstance(statement, ast.Call)
            and isinstance(statement.func, ast.Attribute)
            and statement.func.attr in _ADDING
            and held_path(statement.func.value) == name
        ):
            yield statement.lineno, True


def inplace_line(source: str) -> str | None:
    """The name one line of code changes in place (:func:`inplace_statement`), or None (also for a line of several
    statements, or none).

    >>> inplace_line("self.ema.mul_(0.99).add_(w)  # smooth"), inplace_line("y = x + 1")
    ('self.ema', None)
    """
    try:
        body = ast.parse(source.strip()).body
    except SyntaxError:
        return None
    return inplace_statement(body[0]) if len(body) == 1 else None


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


def cited_lines(trace: Trace) -> list[SourceLines]:
    """The lines the trace's findings cite (``evidence["sites"]``), with :data:`CONTEXT_LINES` either side,
    read now from the run's own files: what a report made from the trace shows, so that rendering it reads
    nothing from the disk of whoever renders it.

    Only files the run's code ran in (the trace's call sites) are read; a relative name is looked up under
    the folder the session started in.  Lines longer than :data:`MAX_LINE_CHARS` are stored cut.
    """
    ran = {site.file for site in trace.sites}
    wanted: dict[str, set[int]] = {}
    for finding in trace.findings:
        for where in finding.evidence.get("sites") or []:
            parsed = parse_where(str(where))
            if parsed is not None and parsed[0] in ran:
                wanted.setdefault(parsed[0], set()).add(parsed[1])
    root = str(trace.options.get("cwd") or os.getcwd())
    blocks = []
    for file, cited in wanted.items():
        text = _file_lines(file, root)
        spans: list[list[int]] = []
        for line in sorted(n for n in cited if n <= len(text)):
            first, last = max(1, line - CONTEXT_LINES), min(len(text), line + CONTEXT_LINES)
            if spans and first <= spans[-1][1] + 1:
                spans[-1][1] = last
            else:
                spans.append([first, last])
        blocks += [SourceLines(file, first, [_cut(t) for t in text[first - 1 : last]]) for first, last in spans]
    return blocks


def _cut(line: str) -> str:
    body = line.rstrip("\r\n")
    return line if len(body) <= MAX_LINE_CHARS else body[: MAX_LINE_CHARS - 1] + "…" + line[len(body) :]


def _file_lines(file: str, root: str) -> list[str]:
    """The lines of a file as a call site names it (relative to ``root``, absolute, a notebook cell or a
    pseudo-file such as ``<stdin>`` that only :mod:`linecache` knows)."""
    if file.startswith("<"):
        return linecache.getlines(file)
    path = file if os.path.isabs(file) else os.path.join(root, file)
    if os.path.isfile(path):
        return linecache.getlines(path)
    return cell_lines(file) or linecache.getlines(file)
