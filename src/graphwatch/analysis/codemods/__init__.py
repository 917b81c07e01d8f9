"""Edits of the user's file as syntax-tree changes that keep its formatting and comments (LibCST).

Each kind of :class:`~graphwatch.model.Edit` has one *codemod*: a function
from the file's tree and the edit to the edited source, or None when the edit
cannot be made safely there (the line is not the statement the edit expects,
the name is not used there, ...).  No codemod guesses: no patch is better than
a wrong one.  :func:`apply_edits` applies a remedy's edits together, from the
last line up, so each edit's line is the line that ran.

Example::

    >>> from graphwatch.model import Edit
    >>> source = "for x in data:\\n    loss = f(x)\\n    loss.backward(retain_graph=True)  # why not\\n"
    >>> print(apply_edits(source, [Edit("drop-retain", "train.py", 3)]), end="")
    for x in data:
        loss = f(x)
        loss.backward()  # why not
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar, cast

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from ...capture.hooks.transforms import hide_from_compiler
from ...model import EDIT_KINDS, Edit

NodeT = TypeVar("NodeT", bound=cst.CSTNode)


class SourceTree:
    """One file's syntax tree, with where each node stands (1-based lines, as tracebacks count them)."""

    def __init__(self, source: str) -> None:
        # (no deep copy: a tree straight from the parser holds no node twice, and copying it took a quarter of the time)
        self.source = source
        self.wrapper = MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True)
        self.module = self.wrapper.module
        self._positions = self.wrapper.resolve(PositionProvider)

    def span(self, node: cst.CSTNode) -> CodeRange:
        """The node's first and last position."""
        return self._positions[node]

    def nodes(self, kind: type[NodeT]) -> Iterator[NodeT]:
        """Every node of ``kind``, in source order."""
        return (node for node in self._positions if isinstance(node, kind))

    def holding(self, line: int, kind: type[NodeT]) -> list[NodeT]:
        """The nodes of ``kind`` whose lines hold ``line``, outermost first."""
        found = [n for n in self.nodes(kind) if self.span(n).start.line <= line <= self.span(n).end.line]
        return sorted(found, key=lambda n: (self.span(n).start.line, -self.span(n).end.line))

    def statement_at(self, line: int) -> cst.SimpleStatementLine | None:
        """The simple statement line that starts and ends on ``line`` (None for anything else: a compound
        statement, a statement running over several lines, a line holding no statement)."""
        for node in self.nodes(cst.SimpleStatementLine):
            where = self.span(node)
            if where.start.line == line == where.end.line:
                return node
        return None

    def code(self, node: cst.CSTNode) -> str:
        """The source text of ``node``, as written."""
        return self.module.code_for_node(node)

    def replaced(self, old: cst.CSTNode, new: cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel) -> str:
        """The file's source with ``old`` (a node of this tree) replaced by ``new``."""
        return cast(cst.Module, self.module.deep_replace(old, new)).code  # type: ignore[type-var]


def file_tree(source: str) -> SourceTree:
    """The tree of a whole file's ``source``, kept until the next file's: the sessions of a test suite patch
    the same file again and again (each test its own session), and a large file takes seconds to parse."""
    kept = _KEPT[0] if _KEPT else None
    if kept is not None and kept.source == source:
        return kept
    _KEPT[:] = [SourceTree(source)]
    return _KEPT[0]


def module_tree(module: cst.Module) -> SourceTree:
    """The :class:`SourceTree` of a file's ``module``: the one :func:`file_tree` keeps when ``module`` is its
    (found without writing the file's code out of the tree: hundreds of milliseconds for a few hundred lines),
    else the tree of its code."""
    kept = _KEPT[0] if _KEPT else None
    return kept if kept is not None and kept.module is module else file_tree(module.code)


_KEPT: list[SourceTree] = []  # the last file's tree (file_tree)


Codemod = Callable[[SourceTree, Edit], "str | None"]
CODEMODS: dict[str, Codemod] = {}


def codemod(kind: str) -> Callable[[Codemod], Codemod]:
    """Register the codemod of one kind of edit (a key of :data:`~graphwatch.model.EDIT_KINDS`)."""
    if kind not in EDIT_KINDS:
        raise ValueError(f"unknown edit kind {kind!r}; add it to graphwatch.model.EDIT_KINDS first")

    def register(function: Codemod) -> Codemod:
        CODEMODS[kind] = function
        return function

    return register


def apply_edits(source: str, edits: Iterable[Edit]) -> str | None:
    """``source`` with every edit made, or None when one of them cannot be made safely.

    Edits are made from the last line up, each on the tree of the file as the
    edits below it left it, so the lines they name stay the lines that ran.
    """
    for edit in sorted(edits, key=lambda e: e.line, reverse=True):
        make = CODEMODS.get(edit.kind)
        if make is None:
            return None
        try:
            tree = file_tree(source)
        except cst.ParserSyntaxError:
            return None
        edited = make(tree, edit)
        if edited is None:
            return None
        source = edited
    return source


from . import calls as calls  # noqa: E402  (each registers its codemods)
from . import cuts as cuts  # noqa: E402
from . import detach as detach  # noqa: E402
from . import inplace as inplace  # noqa: E402
from . import no_grad as no_grad  # noqa: E402
from . import numbers as numbers  # noqa: E402
from . import returned as returned  # noqa: E402

# loaded on first use, maybe by a hook inside a compiled function: Dynamo must skip these frames as graphwatch's others
hide_from_compiler()
