"""pytest plugin: run every test inside ``graphwatch.watch()`` and record each test's outcome.

Used by ``scripts/pytorch_suite.sh`` to run PyTorch's own autograd tests twice,
bare and watched, and compare.  Options (environment):

* ``GRAPHWATCH_SUITE_LEVEL``: a graphwatch level to watch at; unset runs bare;
* ``GRAPHWATCH_SUITE_OUTCOMES``: a JSON file to write ``{test id: outcome}`` to
  (outcome is "passed", "failed", "skipped" or "error", plus the first line of
  the failure for the ones that did not pass);
* ``GRAPHWATCH_SUITE_BUILDS``: a folder to build the C++ extensions the tests
  compile in (``torch.utils.cpp_extension.load_inline``), one subfolder per
  extension, instead of the fresh temporary folder each test names: the build,
  minutes of compiling, is then paid once, and runs started together share it
  (torch's lock in the folder lets one build while the others wait); from the end
  of collection on, where the test files imported torch;
* ``GRAPHWATCH_SUITE_SHARD``: ``i/n`` runs only the tests of shard ``i`` of ``n``
  (``suite.in_shard``: as dealt by the seconds recorded in the JSON file
  ``GRAPHWATCH_SUITE_SECONDS``, else by a hash of the test's id) and deselects the others.

Each test's outcome also has its ``seconds`` (setup, call and teardown).

Example::

    PYTHONPATH=scripts/pytorch_suite GRAPHWATCH_SUITE_LEVEL=default GRAPHWATCH_SUITE_OUTCOMES=watched.json \\
        python -m pytest -p graphwatch_everywhere test/test_autograd.py
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from suite import deal, in_shard, read_seconds  # (this folder is on the path of a run: PYTHONPATH, see the example)

_outcomes: dict[str, dict[str, str]] = {}
_seconds: dict[str, float] = {}  # each test's setup, call and teardown
STALE_LOCK_SECONDS = 30 * 60  # a build's lock this old was left by a killed run (a build takes a few minutes)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build in the kept folder, where the collected tests imported torch (a run of tests without torch, such as
    graphwatch's own tests of this plugin, does not pay for importing it)."""
    builds = os.environ.get("GRAPHWATCH_SUITE_BUILDS")
    if builds and "torch" in sys.modules:
        import torch.utils.cpp_extension as cpp_extension

        cpp_extension.load_inline = _built_in(builds, cpp_extension.load_inline)


def _built_in(builds: str, load_inline: Callable[..., Any]) -> Callable[..., Any]:
    """``load_inline`` building in ``builds/NAME`` whatever build folder it is given."""

    @functools.wraps(load_inline)
    def kept_build(name: str, *args: Any, **kwargs: Any) -> Any:
        folder = os.path.join(builds, name)
        os.makedirs(folder, exist_ok=True)
        lock = os.path.join(folder, "lock")
        with contextlib.suppress(FileNotFoundError):
            if time.time() - os.path.getmtime(lock) > STALE_LOCK_SECONDS:
                os.remove(lock)
        return load_inline(name, *args, **{**kwargs, "build_directory": folder})

    return kept_build


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the tests of the other shards (``GRAPHWATCH_SUITE_SHARD``), as pytest's ``--deselect`` does."""
    shard = os.environ.get("GRAPHWATCH_SUITE_SHARD")
    if not shard:
        return
    index, count = (int(number) for number in shard.split("/"))
    dealt = deal(read_seconds(Path(os.environ.get("GRAPHWATCH_SUITE_SECONDS", ""))), count)
    others = [item for item in items if not in_shard(item.nodeid, (index, count), dealt)]
    if others:
        config.hook.pytest_deselected(items=others)
        items[:] = [item for item in items if in_shard(item.nodeid, (index, count), dealt)]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    level = os.environ.get("GRAPHWATCH_SUITE_LEVEL")
    if not level:
        yield
        return
    import graphwatch

    nested = graphwatch.active_session() is not None  # a test that enters its own session
    with contextlib.nullcontext() if nested else graphwatch.watch(level=level, summary=False):
        yield


def pytest_runtest_logreport(report: Any) -> None:
    _seconds[report.nodeid] = _seconds.get(report.nodeid, 0.0) + report.duration
    if report.when == "call" or report.outcome != "passed":
        failed = report.outcome == "failed"
        outcome = ("failed" if report.when == "call" else "error") if failed else report.outcome
        first = str(report.longrepr).strip().splitlines()[-1][:300] if failed and report.longrepr else ""
        if report.nodeid not in _outcomes or _outcomes[report.nodeid]["outcome"] == "passed":
            _outcomes[report.nodeid] = {"outcome": outcome, "detail": first}


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("GRAPHWATCH_SUITE_OUTCOMES")
    if path:
        timed = {test: {**outcome, "seconds": round(_seconds.get(test, 0.0), 3)} for test, outcome in _outcomes.items()}
        with open(path, "w") as f:
            json.dump(timed, f, indent=1, sort_keys=True)
