"""graphwatch hides its own code from torch.compile (``hide_from_compiler``) at each session's start and after it
loads more of itself; each call reads only the modules loaded since the last one, and all of them again when a
module listed before was removed (the names shift).  Whether compiled code breaks as without graphwatch is
``test_compile_breaks.py``'s."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest

from graphwatch.capture.hooks import transforms


@pytest.fixture
def scratch_modules() -> Iterator[list[str]]:
    """Names of modules a test puts into ``sys.modules``: removed afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        sys.modules.pop(name, None)


def _load(name: str, names: list[str]) -> None:
    module = types.ModuleType(name)
    exec("def probe():\n    return 1\n", vars(module))  # (a function of its own: code to hide)
    sys.modules[name] = module
    names.append(name)


def test_a_graphwatch_module_loaded_since_the_last_call_is_hidden_and_no_other(scratch_modules) -> None:
    transforms.hide_from_compiler()
    _load("graphwatch._hiding_probe_new", scratch_modules)
    _load("not_graphwatch_hiding_probe", scratch_modules)
    transforms.hide_from_compiler()
    assert "graphwatch._hiding_probe_new" in transforms._hidden
    assert "not_graphwatch_hiding_probe" not in transforms._hidden
    assert all(name in transforms._hidden for name in sys.modules if name.startswith("graphwatch."))


def test_a_module_removed_before_the_last_one_seen_makes_the_next_call_read_every_name(scratch_modules) -> None:
    """Removing one module and loading another keeps the count of names: the new one is found all the same."""
    _load("hiding_probe_removed_later", scratch_modules)
    _load("graphwatch._hiding_probe_seen", scratch_modules)
    transforms.hide_from_compiler()
    del sys.modules["hiding_probe_removed_later"]
    _load("graphwatch._hiding_probe_after_a_removal", scratch_modules)
    transforms.hide_from_compiler()
    assert {"graphwatch._hiding_probe_seen", "graphwatch._hiding_probe_after_a_removal"} <= transforms._hidden
