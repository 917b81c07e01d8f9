"""Finding a code object's function in its file walks the file's syntax tree once per version of the file.

``function_node`` runs at each session's step ends (where a loop's step ends): PyTorch's ``test_autograd.py`` (ten
thousand lines), run with every test inside a session, walked its whole tree for every one of them.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path
from types import CodeType

import pytest

from graphwatch.capture.lines import source

PROGRAM = '''import functools


def plain():
    pass


@functools.lru_cache
@staticmethod
def decorated():
    pass


class Model:
    def forward(self):
        def nested():
            pass
        return nested
'''


def _codes(code: CodeType) -> Iterator[CodeType]:
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            yield constant
            yield from _codes(constant)


@pytest.fixture
def tree_walks(monkeypatch: pytest.MonkeyPatch) -> list[ast.AST]:
    """Every whole-file walk (``ast.walk`` of a module) from here on: ``ast.walk`` itself, counted."""
    walks: list[ast.AST] = []
    walk = ast.walk

    def counted(node: ast.AST) -> Iterator[ast.AST]:
        if isinstance(node, ast.Module):
            walks.append(node)
        return walk(node)

    monkeypatch.setattr(ast, "walk", counted)
    return walks


def test_every_function_of_a_file_is_found_with_one_walk_of_its_tree_and_again_after_an_edit(tmp_path: Path,
                                                                                            tree_walks: list):
    path = tmp_path / "program.py"
    path.write_text(PROGRAM)
    codes = {code.co_name: code for code in _codes(compile(PROGRAM, str(path), "exec"))}
    found = {name: source.function_node(code) for name, code in codes.items()}
    assert {name: node and (node.name, node.lineno) for name, node in found.items()} == {  # type: ignore[attr-defined]
        "plain": ("plain", 4), "decorated": ("decorated", 10), "Model": None,  # (a class body is no function)
        "forward": ("forward", 15), "nested": ("nested", 16)}  # fmt: skip
    assert len(tree_walks) == 1
    assert source.function_node(compile(PROGRAM, str(path), "exec")).body[0].names[0].name == "functools"  # type: ignore[union-attr]

    edited = PROGRAM + "\n\ndef added():\n    pass\n"
    path.write_text(edited)
    os.utime(path, ns=(0, 0))  # (a new version even where the clock's step is coarse: mtime and size differ)
    added = next(code for code in _codes(compile(edited, str(path), "exec")) if code.co_name == "added")
    assert source.function_node(added).name == "added"  # type: ignore[union-attr]
    assert source.function_node(codes["plain"]) is not None  # (its lines did not move)
    assert len(tree_walks) == 2
    assert source.function_node(added.replace(co_firstlineno=1)) is None  # a name at another line is not it
