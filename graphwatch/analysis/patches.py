"""A patch for each finding whose fix is one edit of the user's file: a unified diff they can apply.

The patch does what the finding's fix says, at the line it names, and no
more: the detach that cuts a carried graph (and the ``retain_graph=True`` it
makes unneeded), ``.item()`` where a number is kept instead of a graph,
``with torch.no_grad():`` around an evaluation forward (around its whole
evaluation loop, re-indented, when the loop does nothing else), ``retain_graph=True``
dropped from the last backward, ``zero_grad()`` before a backward.  A fix
that needs judgement (which of two backwards to drop, where a GAN's
generator output must be detached) gets no patch: no patch is better than a
wrong one.  Each edit is made only where the cited line is a whole, simple
statement of the file as it is now (checked with :mod:`ast`).

Diff paths are the finding's cited paths (relative to the session's working
folder when the file is inside it), so ``patch -p0`` applies it from there; a
file outside that folder is named as in its own folder, and a first line says
where to apply it (``# in /abs/folder: patch -p0``).

Example::

    >>> from graphwatch.model import Finding
    >>> finding = Finding("retained-graph", "warning", 3, "m", "drop retain_graph=True at nowhere.py:3")
    >>> patch_for(finding, cwd=".") is None  # the file is not there: no patch
    True
"""

from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from ..model import Finding, Trace
from ..model.columns import field_values

Edit = Callable[[list[str]], list[str] | None]  # the file's lines -> the edited lines, or None: no patch

_WHERE = re.compile(r"(?P<file>[^\s`(]+\.py):(?P<line>\d+)")
_RETAIN = re.compile(r",?\s*retain_graph\s*=\s*True\s*,?")
_ZERO_GRAD = re.compile(r"call `(?P<call>[\w.]+\.zero_grad\(\))` before the backward at " + _WHERE.pattern)


def add_patches(trace: Trace) -> None:
    """Set ``finding.patch`` for every finding of ``trace`` whose fix is one edit of the user's file."""
    cwd = str(trace.options.get("cwd") or ".")
    training = training_lines(trace)
    by_carrier = {f.evidence.get("carrier_where"): f for f in trace.findings if f.kind == "graph-carried-across-steps"}
    for finding in trace.findings:
        if finding.patch is None:
            carried = by_carrier.get(finding.evidence.get("carrier_at"))
            if finding.kind == "backward-through-freed-graph" and carried is not None:
                finding.patch = patch_for(carried, cwd, training)  # the same edit as the carried graph's finding
            else:
                finding.patch = patch_for(finding, cwd, training)


def training_lines(trace: Trace) -> dict[str, set[int]]:
    """File -> the lines where the run called a backward or an optimizer's step (what must keep its graph).

    >>> training_lines(Trace())
    {}
    """
    sites = dict.fromkeys([*field_values(trace.backwards, "site"), *field_values(trace.steps, "optimizer_site")])
    lines: dict[str, set[int]] = {}
    for site in sites:
        where = _where(trace.where(site)) if site is not None else None
        if where is not None:
            lines.setdefault(where[0], set()).add(where[1])
    return lines


def patch_for(finding: Finding, cwd: str, training: Mapping[str, Collection[int]] | None = None) -> str | None:
    """The unified diff that applies ``finding``'s fix, or None when the fix is not one safe edit.

    ``training``: file -> lines that call a backward or an optimizer's step (:func:`training_lines`): an
    evaluation loop holding one of them is not put under ``torch.no_grad()``.
    """
    planned = _plan(finding, training or {})
    if planned is None:
        return None
    where, edit = planned
    path = Path(cwd, where) if not Path(where).is_absolute() else Path(where)
    try:
        lines = path.read_text().splitlines(keepends=True)
    except (OSError, UnicodeDecodeError):
        return None
    edited = edit(lines)
    if edited is None or edited == lines or not _parses(edited):
        return None
    if not Path(where).is_absolute():
        return "".join(difflib.unified_diff(lines, edited, fromfile=where, tofile=where, n=2))
    # patch and git apply refuse absolute names: name the file in its own folder, and say where that is
    diff = "".join(difflib.unified_diff(lines, edited, fromfile=path.name, tofile=path.name, n=2))
    return f"# in {path.parent}: patch -p0\n{diff}"


def _plan(finding: Finding, training: Mapping[str, Collection[int]]) -> tuple[str, Edit] | None:
    """(file, edit) for the kinds of fix that are one edit of one file."""
    ev = finding.evidence
    if finding.kind == "graph-carried-across-steps" and ev.get("pattern") == "recurrent" and ev.get("detach"):
        where = _where(ev.get("carrier_where"))
        if where is None:
            return None
        file, line = where
        backward = _where(ev.get("backward"))
        if backward is None or backward[0] != file or backward[1] <= line:
            return None
        retain = backward[1] if "retain_graph" in finding.fix else None
        return file, _combine(_detach_at_step_start(line, backward[1], str(ev["detach"])), _drop_retain(retain))
    if finding.kind == "graph-kept-alive":
        evaluation = ev.get("evaluation_at") or []
        if ev.get("never_backwarded") and evaluation and finding.fix.startswith("run the forward at"):
            where = _where(evaluation[0])
            return (where[0], _under_no_grad(where[1], training.get(where[0], ()))) if where else None
        holder = _where(ev.get("key"))
        name = ev.get("holder")
        if ev.get("suggestion") and holder and isinstance(name, str) and finding.fix.startswith("keep a number"):
            return holder[0], _combine(_replace_statement(holder[1], str(ev["suggestion"])), _numbers_read(name, holder[1]))
        return None
    if finding.kind == "retained-graph" and finding.fix.startswith("drop retain_graph=True at"):
        where = _where(finding.fix)
        return (where[0], _drop_retain(where[1])) if where else None
    if finding.kind == "missing-zero-grad":
        match = _ZERO_GRAD.match(finding.fix)
        if match:
            return match["file"], _insert_before(int(match["line"]), match["call"])
    return None


def _where(text: object) -> tuple[str, int] | None:
    match = _WHERE.search(text) if isinstance(text, str) else None
    return (match["file"], int(match["line"])) if match else None


# ------------------------------------------------------------------ edits
def _statement_at(lines: list[str], line: int) -> ast.stmt | None:
    """The simple statement that starts on ``line`` and ends on it (None if the line is anything else)."""
    try:
        tree = ast.parse("".join(lines))
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and not hasattr(node, "body") and node.lineno == line == node.end_lineno:
            return node
    return None


def _indent(text: str) -> str:
    return text[: len(text) - len(text.lstrip())]


def _insert_before(line: int, statement: str) -> Edit:
    def edit(lines: list[str]) -> list[str] | None:
        if _statement_at(lines, line) is None:
            return None
        new = f"{_indent(lines[line - 1])}{statement}\n"
        return [*lines[: line - 1], new, *lines[line - 1 :]]

    return edit


def _detach_at_step_start(carrier: int, backward: int, statement: str) -> Edit:
    """``statement`` (the detach) first in the step: before the statement of the training loop's body (the
    innermost loop holding both the carrier's line and the backward's) that holds the carrier's line, so an
    inner loop over time steps still backpropagates through all of them."""

    def edit(lines: list[str]) -> list[str] | None:
        try:
            tree = ast.parse("".join(lines))
        except SyntaxError:
            return None
        loops = [n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.While, ast.AsyncFor))]
        holding = [n for n in loops if _spans(n, carrier) and _spans(n, backward)]
        if not holding:
            return None
        loop = max(holding, key=lambda n: n.lineno)  # the innermost
        first = next((s for s in loop.body if _spans(s, carrier)), None)
        if first is None:
            return None
        new = f"{_indent(lines[first.lineno - 1])}{statement}\n"
        return [*lines[: first.lineno - 1], new, *lines[first.lineno - 1 :]]

    return edit


def _spans(node: ast.AST, line: int) -> bool:
    first, last = getattr(node, "lineno", 0), getattr(node, "end_lineno", None)
    return bool(first <= line <= (last or first))


def _numbers_read(holder: str, kept_at: int) -> Edit:
    """Where the holder now keeps numbers: ``holder.item()`` (or ``holder[i].item()``) elsewhere becomes the
    number itself; any other use as a tensor (another attribute, iterating over it) leaves no patch."""
    name = re.escape(holder)
    item = re.compile(rf"\b{name}(\[[^\]]*\])?\.item\(\)")
    other = re.compile(rf"\b{name}(\[[^\]]*\])?\.(?!item\(\)|append\(|extend\()\w+|\bin\s+{name}\b")

    def edit(lines: list[str]) -> list[str] | None:
        edited = []
        for number, text in enumerate(lines, 1):
            if number != kept_at and other.search(text):
                return None
            edited.append(text if number == kept_at else item.sub(lambda m: f"{holder}{m[1] or ''}", text))
        return edited

    return edit


def _replace_statement(line: int, statement: str) -> Edit:
    """The statement on ``line`` becomes ``statement``; its indentation and a trailing comment stay."""

    def edit(lines: list[str]) -> list[str] | None:
        node = _statement_at(lines, line)
        if node is None:
            return None
        text = lines[line - 1]
        start, end = node.col_offset, node.end_col_offset or len(text)
        newline = "\n" if text.endswith("\n") else ""
        return [*lines[: line - 1], text[:start] + statement + text[end:].rstrip("\n") + newline, *lines[line:]]

    return edit


def _under_no_grad(line: int, training: Collection[int]) -> Edit:
    """``with torch.no_grad():`` around the statement that starts on ``line`` or, when the statement is in a
    loop that does nothing but evaluate (:func:`_evaluation_loop`), around that whole loop; what it wraps is
    re-indented."""

    def edit(lines: list[str]) -> list[str] | None:
        tree = _parse(lines)
        if tree is None or not _imports_torch(lines):
            return None
        statement = next((n for n in ast.walk(tree) if isinstance(n, ast.stmt) and not hasattr(n, "body")
                          and n.lineno == line), None)  # fmt: skip
        if statement is None:
            return None
        spans = [(n.lineno, n.end_lineno or n.lineno) for n in (_evaluation_loop(tree, lines, line, training), statement) if n]
        first, last = next(((a, b) for a, b in spans if _reindentable(tree, lines, a, b)), (0, 0))
        if not first:
            return None
        block = [f"    {text}" if text.strip() else text for text in lines[first - 1 : last]]
        return [*lines[: first - 1], f"{_indent(lines[first - 1])}with torch.no_grad():\n", *block, *lines[last:]]

    return edit


_TRAINING_CALL = re.compile(r"\.backward\(|\.step\(|zero_grad|autograd\.grad|\.train\(")


def _evaluation_loop(tree: ast.Module, lines: list[str], line: int, training: Collection[int]) -> ast.stmt | None:
    """The outermost loop holding ``line`` that only evaluates: no backward, optimizer step, ``zero_grad``,
    ``autograd.grad`` or ``.train(`` in its text, none of the run's backward or step lines, no call of a
    function the file defines (it could train) and no definition; None if there is no such loop."""
    defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}

    def only_evaluates(loop: ast.stmt) -> bool:
        first, last = loop.lineno, loop.end_lineno or loop.lineno
        if _TRAINING_CALL.search("".join(lines[first - 1 : last])) or any(first <= t <= last for t in training):
            return False
        inner = list(ast.walk(loop))
        calls_own = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in defined for n in inner)
        return not calls_own and not any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in inner)

    loops = [n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.AsyncFor, ast.While)) and _spans(n, line)]
    evaluating = [loop for loop in loops if only_evaluates(loop)]
    return min(evaluating, key=lambda loop: loop.lineno) if evaluating else None


def _reindentable(tree: ast.Module, lines: list[str], first: int, last: int) -> bool:
    """Whether lines ``first``..``last`` can move right by four spaces as text: indented with spaces only,
    and no string literal spanning lines there (its text would change)."""
    if any("\t" in _indent(text) for text in lines[first - 1 : last]):
        return False
    strings = (n for n in ast.walk(tree) if isinstance(n, (ast.Constant, ast.JoinedStr)))
    return not any(n.lineno != n.end_lineno and first <= n.lineno <= last for n in strings
                   if not isinstance(n, ast.Constant) or isinstance(n.value, (str, bytes)))


def _drop_retain(line: int | None) -> Edit:
    def edit(lines: list[str]) -> list[str] | None:
        if line is None:
            return lines
        text = lines[line - 1]
        found = len(_RETAIN.findall(text))
        if not found:
            return lines  # nothing to drop there
        if _statement_at(lines, line) is None or found != 1:
            return None
        dropped = _RETAIN.sub(lambda m: ", " if m[0].startswith(",") and m[0].rstrip().endswith(",") else "", text)
        return [*lines[: line - 1], dropped, *lines[line:]]

    return edit


def _combine(*edits: Edit) -> Edit:
    """Edits given from the first line down, applied from the last up (each names lines of the file as it was;
    an edit of the whole file, such as :func:`_numbers_read`, goes last and keeps the number of lines)."""

    def edit(lines: list[str]) -> list[str] | None:
        result: list[str] | None = lines
        for step in reversed(edits):
            result = step(result) if result is not None else None
        return result

    return edit


def _parse(lines: list[str]) -> ast.Module | None:
    try:
        return ast.parse("".join(lines))
    except SyntaxError:
        return None


def _parses(lines: list[str]) -> bool:
    return _parse(lines) is not None


def _imports_torch(lines: list[str]) -> bool:
    return any(re.match(r"\s*(import torch\b|from torch\b)", text) for text in lines)
