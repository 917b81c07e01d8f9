"""Shared fixtures of graphwatch's own tests.

Kept small on purpose.  Nothing here is autouse and nothing is named like the
``graphwatch`` pytest plugin (fixture ``graphwatch_session``, marker
``graphwatch``), so the plugin's tests can share this folder.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import graphwatch

if os.environ.get("PYTEST_XDIST_WORKER"):  # a worker of `pytest -n` (scripts/test.sh): pytest-xdist gives it
    os.environ.pop("COLUMNS", None)  # COLUMNS=80, which a serial run does not have (the summary's width)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The table of PyTorch's own autograd tests (each shard's test in ``test_pytorch_suite.py`` records its result on
    its report, which a ``pytest -n`` worker sends here; ``summary`` adds them up), whatever the verbosity."""
    reports = terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", [])
    parts = [text for report in reports if report.when == "call"
             for name, text in getattr(report, "user_properties", []) if name == "pytorch_suite_table"]  # fmt: skip
    if parts:
        from test_pytorch_suite import summary

        terminalreporter.write_sep("-", "PyTorch's own autograd tests, bare and inside a session")
        terminalreporter.write_line(summary(parts))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """PyTorch's own autograd suite first: the longest test (its own processes), started while the rest run."""
    items.sort(key=lambda item: "test_pytorch_suite.py" not in item.nodeid)


@pytest.fixture
def no_session_left():
    """Fail a test that leaves a graphwatch session active (and clean up after it)."""
    yield
    session = graphwatch.active_session()
    if session is not None:
        session.__exit__(None, None, None)
        pytest.fail("the test left a graphwatch session active")


@pytest.fixture
def one_thread(no_session_left: None) -> Iterator[None]:
    """One torch thread for the test (timings and per-op records that do not depend on the thread pool), and
    no graphwatch session left after it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def bare_and_watched() -> Callable[..., tuple[Any, Any, graphwatch.Session]]:
    """``run(fn, **options)``: call ``fn()`` bare, then again inside ``graphwatch.watch(summary=False, **options)``.

    ``fn`` must build everything it uses from a fixed seed (it is called
    twice); the seed is reset before each call.  Returns (bare result,
    watched result, session).
    """

    def run(fn: Callable[[], Any], **options: Any) -> tuple[Any, Any, graphwatch.Session]:
        torch.manual_seed(0)
        bare = fn()
        torch.manual_seed(0)
        with graphwatch.watch(summary=False, **options) as gw:
            watched = fn()
        return bare, watched, gw

    return run


def assert_all_equal(bare: dict[str, torch.Tensor], watched: dict[str, torch.Tensor]) -> None:
    """Every named tensor bit-identical (torch.equal), and the same names on both sides."""
    assert bare.keys() == watched.keys()
    assert bare, "nothing was compared"
    different = [name for name in bare if not torch.equal(bare[name], watched[name])]
    assert not different, f"differ with graphwatch: {different}"


@pytest.fixture
def same_tensors() -> Callable[[dict[str, torch.Tensor], dict[str, torch.Tensor]], None]:
    """``check(bare, watched)``: every named tensor bit-identical on both sides."""
    return assert_all_equal


def tagged_line(function: Callable[..., Any], tag: str) -> str:
    """``file:line`` (relative to the working directory, as findings cite it) of the line of ``function``
    that ends with the comment ``# at: <tag>``."""
    function = inspect.unwrap(function)
    lines, first = inspect.getsourcelines(function)
    number = next(first + i for i, text in enumerate(lines) if text.rstrip().endswith(f"# at: {tag}"))
    return f"{os.path.relpath(inspect.getsourcefile(function) or '')}:{number}"


@pytest.fixture
def at() -> Callable[[Callable[..., Any], str], str]:
    """``at(function, tag)``: the ``file:line`` of ``function``'s line tagged ``# at: tag``."""
    return tagged_line
