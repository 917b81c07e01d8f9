"""Every module's docstring example runs (the README promises a runnable example in each)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import graphwatch

PACKAGES = {info.name for info in pkgutil.walk_packages(graphwatch.__path__, "graphwatch.") if info.ispkg}
MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(graphwatch.__path__, "graphwatch.")
    if not info.name.endswith("__main__")  # running it would start the command line
)
# Its example is a test file: tests/test_pytest_plugin.py runs it under pytest.
EXAMPLE_RUN_ELSEWHERE = {"graphwatch.pytest_plugin"}


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, name
    if name not in PACKAGES | EXAMPLE_RUN_ELSEWHERE:
        assert result.attempted > 0, f"{name} has no runnable example in its docstrings"
