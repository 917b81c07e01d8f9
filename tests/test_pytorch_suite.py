"""PyTorch's own autograd tests pass inside a session as they pass without one.

Runs ``scripts/pytorch_suite/suite.py`` on ``../shared/pytorch-tests`` (PyTorch's test files, byte-exact,
kept beside the repository and never copied into it): the files run with pytest once at each level here,
every test inside ``graphwatch.watch()``, and are compared with the bare run recorded for this torch, this
Python and these files (``scripts/pytorch_suite/bare/``), or with a bare run beside them where no record
matches.  A test that passes bare must pass watched, unless it is one of the proven impossibilities
(``IMPOSSIBLE`` there, explained in ``docs/pytorch-suite.md``).  The table is printed in the terminal
summary.  The precise level runs from ``bash scripts/pytorch_suite.sh`` (the test command stays under ten
minutes).  Skipped, with one line saying where the files come from, where the folder is absent.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
LEVELS = ("default", "light")
SUMMARY = "pytorch_suite_table"  # the report property conftest.pytest_terminal_summary prints


def _suite_module() -> Any:
    spec = importlib.util.spec_from_file_location("pytorch_suite", ROOT / "scripts" / "pytorch_suite" / "suite.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


suite = _suite_module()


def test_pytorchs_autograd_tests_pass_inside_a_session_as_without_it(record_property):
    folder = suite.find_folder()
    if folder is None:
        pytest.skip(suite.MISSING)
    results = suite.run_and_compare(folder, LEVELS)
    text = suite.report(results)
    record_property(SUMMARY, f"{folder}\n{text}")  # (conftest prints it in the terminal summary, also from a worker)
    assert all(r.passed_bare for r in results), f"no test passed bare: is the folder complete?\n{text}"
    assert not any(r.unexpected for r in results), text


def _outcomes(**tests: str) -> dict[str, dict[str, str]]:
    return {test: {"outcome": outcome, "detail": ""} for test, outcome in tests.items()}


def test_a_difference_counts_where_it_repeats_and_is_not_a_proven_impossibility():
    impossible = next(iter(suite.IMPOSSIBLE))
    bare = {**_outcomes(broken="passed", flaky="passed", bare_flaky="failed"), **_outcomes(**{impossible: "passed"})}
    watched = {**_outcomes(broken="failed", flaky="failed", bare_flaky="passed"), **_outcomes(**{impossible: "failed"})}
    default = suite.compare("default", bare, watched)
    default.recheck(bare, watched, _outcomes(broken="passed", flaky="passed", bare_flaky="passed"),
                    _outcomes(broken="failed", flaky="passed", bare_flaky="passed"))  # fmt: skip
    assert default.impossible == [impossible]
    assert [test for test, _ in default.broken] == ["broken"]
    assert sorted(test for test, _ in default.flaky) == ["bare_flaky", "flaky"]
    assert (default.passed_bare, default.passed_watched) == (4, 2)  # the flaky ones pass both ways when run again
    assert default.unexpected
    light = suite.compare("light", bare, watched)  # (light has no saved-tensor hooks: not impossible there)
    assert impossible in [test for test, _ in light.broken]


def test_an_impossibility_that_passes_fails_the_suite():
    impossible = next(iter(suite.IMPOSSIBLE))
    result = suite.compare("default", _outcomes(**{impossible: "passed"}), _outcomes(**{impossible: "passed"}))
    assert result.stale == [impossible]
    assert result.unexpected


def test_a_test_that_crashes_torch_itself_is_left_out_of_every_run():
    """``CRASH_TORCH`` lists tests that segfault torch now and then without graphwatch: a run of one of them, bare
    or inside a session, deselects it (a crash would leave no outcomes to compare), and the table says so."""
    folder = suite.find_folder()
    if folder is None:
        pytest.skip(suite.MISSING)
    crashing = next(iter(suite.CRASH_TORCH))
    copy = suite.writable_copy(folder)
    try:
        runs = [suite._start(copy, level, [crashing], level or "bare") for level in ("", "default")]  # (together)
        for process, outcomes, log in runs:
            assert process.wait() == 5, log.read_text()  # pytest's "no test ran": the only test was deselected
            assert "1 deselected" in log.read_text()
            assert crashing not in (json.loads(outcomes.read_text()) if outcomes.is_file() else {})
    finally:
        shutil.rmtree(copy.parent, ignore_errors=True)
    assert f"left out of every run: `{suite._short(crashing)}`" in suite.table([])


def test_a_recorded_bare_run_stands_in_only_for_the_same_torch_python_and_files(tmp_path, monkeypatch):
    """The record is keyed by torch's and Python's versions (its file name) and by every byte of the test folder:
    a changed file, or no record, means the bare pass runs again."""
    folder = tmp_path / "tests"
    (folder / "autograd").mkdir(parents=True)
    (folder / suite.FILES[0]).write_text("def test_one():\n    pass\n")
    (folder / suite.FILES[1]).write_text("def test_two():\n    assert False\n")
    monkeypatch.setattr(suite, "BARE_RECORDS", tmp_path / "bare")
    assert suite.recorded_bare(folder) is None  # no record
    ran = suite.run_and_compare(folder, ("light",), run_bare=True)[0]
    assert (ran.passed_bare, ran.passed_watched) == (1, 1)
    outcomes = {"test_autograd.py::test_one": {"outcome": "passed", "detail": ""}}
    record = suite.record_bare(folder, outcomes)
    assert record.parent == tmp_path / "bare" and record.name.startswith(f"torch-{torch.__version__}-py")
    assert suite.recorded_bare(folder) == outcomes
    recorded = suite.run_and_compare(folder, ("light",))[0]  # no bare process: the record says test_one passes
    assert (recorded.passed_bare, recorded.passed_watched, recorded.unexpected) == (1, 1, False)
    (folder / suite.FILES[1]).write_text("def test_two():\n    pass\n")  # one byte of the folder changed
    assert suite.recorded_bare(folder) is None


def test_the_committed_record_matches_the_shared_test_files():
    """The record the test command compares with is the one for the files beside the repository, on the torch and
    Python of ``constraints.txt`` and CI (a stale record would make every run a bare run too)."""
    folder = suite.find_folder()
    if folder is None:
        pytest.skip(suite.MISSING)
    if not suite.bare_record(folder).is_file():
        pytest.skip(f"no record for this torch and Python ({suite.bare_record(folder).name}): the bare pass runs")
    recorded = suite.recorded_bare(folder)
    assert recorded is not None, "the record is for other test files: `bash scripts/pytorch_suite.sh --record-bare`"
    assert sum(r["outcome"] == "passed" for r in recorded.values()) >= 500


def test_an_extension_a_test_builds_is_built_once_in_the_kept_folder_whatever_folder_the_test_names(tmp_path,
                                                                                                     monkeypatch):
    """PyTorch's tests build C++ extensions in a fresh temporary folder each (minutes of compiling): the runs build
    them in one kept folder per torch and Python instead, so that a second run, or a second level, builds nothing."""
    folder = tmp_path / "tests"
    folder.mkdir()
    (folder / "test_build.py").write_text(
        "import os, tempfile\n"
        "from torch.utils import cpp_extension\n\n"
        "def test_build():\n"
        "    named = tempfile.mkdtemp()\n"
        "    library = cpp_extension.load_inline(name='graphwatch_tiny', cpp_sources='extern \"C\" int answer() "
        "{ return 42; }', no_implicit_headers=True, is_python_module=False, build_directory=named)\n"
        "    assert os.path.isfile(library) and not os.listdir(named)\n"
    )
    monkeypatch.setattr(suite, "BUILDS", tmp_path / "builds")
    built = tmp_path / "builds" / suite._versions() / "graphwatch_tiny" / "graphwatch_tiny.so"

    def built_after_a_run(name: str) -> int:
        process, outcomes, log = suite._start(folder, "light", ["test_build.py"], name)
        assert process.wait() == 0, log.read_text()
        assert json.loads(outcomes.read_text())["test_build.py::test_build"]["outcome"] == "passed"
        return built.stat().st_mtime_ns

    assert built_after_a_run("first") == built_after_a_run("again")  # the second run loaded the first one's build
