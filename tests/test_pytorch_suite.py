"""PyTorch's own autograd tests pass inside a session as they pass without one.

Runs ``scripts/pytorch_suite/suite.py`` on ``../shared/pytorch-tests`` (PyTorch's test files, byte-exact,
kept beside the repository and never copied into it): the files run with pytest at each level here, every
test inside ``graphwatch.watch()``, in ``SHARDS`` shards per level (one test each, so that pytest-xdist
spreads them over its workers), and each shard is compared with the same shard of the bare run recorded
for this torch, this Python and these files (``scripts/pytorch_suite/bare/``), or with a bare run beside it
where no record matches.  A test that passes bare must pass watched, unless it is one of the proven
impossibilities (``IMPOSSIBLE`` there, explained in ``docs/pytorch-suite.md``).  The shards' results are
printed as one table in the terminal summary (``summary``, called by ``conftest.py``).  The precise level
runs from ``bash scripts/pytorch_suite.sh`` (the test command stays under ten minutes).  Skipped, with one
line saying where the files come from, where the folder is absent.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
LEVELS = ("default", "light")
SHARDS = 2  # per level, dealt by recorded seconds (a third shard per level costs one more ~17 s start and collection)
SUMMARY = "pytorch_suite_table"  # the report property conftest.pytest_terminal_summary reads (``summary``)


def _suite_module() -> Any:
    spec = importlib.util.spec_from_file_location("pytorch_suite", ROOT / "scripts" / "pytorch_suite" / "suite.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


suite = _suite_module()


def summary(parts: list[str]) -> str:
    """The one table of the shards' results that the terminal summary prints: ``parts`` are the ``SUMMARY``
    properties the shards' tests recorded (the folder, then the result as JSON)."""
    folders, results = zip(*(part.split("\n", 1) for part in parts))
    merged = sorted(suite.merge([suite.LevelResult.from_json(result) for result in results]),
                    key=lambda result: LEVELS.index(result.level))  # (in the order of LEVELS, whichever ended first)
    shards = f"{len(parts)} of {len(LEVELS) * SHARDS} shards" if len(parts) < len(LEVELS) * SHARDS else "all tests"
    return f"{', '.join(sorted(set(folders)))} ({shards})\n{suite.report(merged)}"


@pytest.mark.parametrize("shard", range(SHARDS), ids=lambda shard: f"shard{shard + 1}of{SHARDS}")
@pytest.mark.parametrize("level", LEVELS)
def test_pytorchs_autograd_tests_pass_inside_a_session_as_without_it(level, shard, record_property):
    folder = suite.find_folder()
    if folder is None:
        pytest.skip(suite.MISSING)
    [result] = suite.run_and_compare(folder, (level,), shard=(shard, SHARDS))
    record_property(SUMMARY, f"{folder}\n{result.to_json()}")  # (conftest prints them, also from a worker)
    text = suite.report([result])
    assert result.passed_bare, f"no test of this shard passed bare: is the folder complete?\n{text}"
    assert not result.unexpected, text


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


@pytest.fixture
def no_plugin_autoload(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs of a tiny test folder load only the plugins they name: entry-point plugins such as hypothesis's
    take seconds to import, for tests that do not use them."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def _fake_tests(folder: Path, source: str) -> Path:
    """A folder of PyTorch's layout whose ``test_autograd.py`` is ``source`` (the other file is empty)."""
    (folder / "autograd").mkdir(parents=True)
    (folder / suite.FILES[0]).write_text(source)
    (folder / suite.FILES[1]).write_text("")
    return folder


def test_a_test_that_crashes_torch_itself_is_left_out_of_every_run(tmp_path, no_plugin_autoload):
    """``CRASH_TORCH`` lists tests that segfault torch now and then without graphwatch: a run of one of them, bare
    or inside a session, deselects it (a crash would leave no outcomes to compare), and the table says so."""
    crashing = next(iter(suite.CRASH_TORCH))
    file, cls, name = crashing.split("::")
    assert file == suite.FILES[0]
    folder = _fake_tests(tmp_path / "tests", f"import os\nimport unittest\n\n\nclass {cls}(unittest.TestCase):\n"
                                              f"    def {name}(self):\n        os.abort()  # a crash, as torch's\n")
    runs = [suite._start(folder, level, [crashing], level or "bare") for level in ("", "default")]  # (together)
    for process, outcomes, log in runs:
        assert process.wait() == 5, log.read_text()  # pytest's "no test ran": the only test was deselected
        assert "1 deselected" in log.read_text()
        assert crashing not in (json.loads(outcomes.read_text()) if outcomes.is_file() else {})
    assert f"left out of every run: `{suite._short(crashing)}`" in suite.table([])


SHARDED = [f"test_{name}" for name in ("one", "two", "three", "four", "five", "six")]


def test_a_shard_runs_only_its_tests_and_is_compared_with_only_its_part_of_the_bare_record(tmp_path, monkeypatch,
                                                                                           no_plugin_autoload):
    """Each shard's process deselects the other shards' tests, and its comparison counts only its own tests of the
    recorded bare run (the others would be missing, so broken); the shards add up to every test."""
    folder = _fake_tests(tmp_path / "tests", "".join(f"def {test}():\n    pass\n\n\n" for test in SHARDED))
    tests = [f"{suite.FILES[0]}::{test}" for test in SHARDED]
    shards = [(index, 2) for index in range(2)]
    assert all(any(suite.in_shard(test, shard) for test in tests) for shard in shards)  # (neither shard is empty)
    runs = [suite._start(folder, "", list(suite.FILES), f"bare-{index}", (index, count)) for index, count in shards]
    ran = []
    for (process, outcomes, log), shard in zip(runs, shards):
        assert process.wait() == 0, log.read_text()
        ran.append(set(json.loads(outcomes.read_text())))
        assert ran[-1] == {test for test in tests if suite.in_shard(test, shard)}
    assert ran[0] | ran[1] == set(tests) and not ran[0] & ran[1]
    monkeypatch.setattr(suite, "BARE_RECORDS", tmp_path / "bare")
    suite.record_bare(folder, {test: {"outcome": "passed", "detail": ""} for test in tests})
    [watched] = suite.run_and_compare(folder, ("light",), shard=shards[0])  # inside a session, against the record
    assert (watched.passed_bare, watched.passed_watched, watched.unexpected) == (len(ran[0]), len(ran[0]), False)
    other = suite.LevelResult("light", len(ran[1]), len(ran[1]), flaky=[("flaky", "bare failed; run again: both")])
    [merged] = suite.merge([suite.LevelResult.from_json(watched.to_json()), other])
    assert (merged.passed_bare, merged.passed_watched, merged.flaky) == (6, 6, other.flaky)


def test_the_shards_are_dealt_by_recorded_seconds_longest_first_and_unrecorded_tests_by_hash(tmp_path, monkeypatch,
                                                                                          no_plugin_autoload):
    """With each test's seconds recorded, a long test fills a shard of its own and the short ones share the other
    (the shards take about the same time); a test missing from the record goes by the hash of its id.  The runs
    deselect by the same rule, and each test's outcome carries its seconds (which the bare record leaves out)."""
    folder = _fake_tests(tmp_path / "tests", "".join(f"def {test}():\n    pass\n\n\n" for test in SHARDED))
    tests = [f"{suite.FILES[0]}::{test}" for test in SHARDED]
    recorded, unrecorded = tests[:-1], tests[-1]
    monkeypatch.setattr(suite, "SECONDS", tmp_path / "seconds.json")
    suite.SECONDS.write_text(json.dumps({recorded[2]: 9.0, **{test: 1.0 for test in recorded if test != recorded[2]}}))
    shards = [(index, 2) for index in range(2)]
    runs = [suite._start(folder, "", list(suite.FILES), f"bare-{index}", (index, count)) for index, count in shards]
    ran = []
    for process, outcomes, log in runs:
        assert process.wait() == 0, log.read_text()
        ran.append(json.loads(outcomes.read_text()))
    by_hash = {test for test in [unrecorded] if suite.zlib.crc32(test.encode()) % 2 == 1}
    assert set(ran[0]) == {recorded[2]} | ({unrecorded} - by_hash)  # the long one, alone but for the hashed one
    assert set(ran[1]) == (set(recorded) - {recorded[2]}) | by_hash
    assert all(isinstance(outcome["seconds"], float) for outcome in ran[0].values())
    monkeypatch.setattr(suite, "BARE_RECORDS", tmp_path / "bare")
    suite.record_bare(folder, ran[0])
    assert all("seconds" not in outcome for outcome in json.loads(suite.bare_record(folder).read_text())["outcomes"]
               .values())  # fmt: skip


def test_recording_seconds_runs_each_level_and_adds_each_tests_seconds_up(tmp_path, monkeypatch, no_plugin_autoload):
    """``--record-seconds`` runs every test at each level named and records its seconds over them added up: the
    record the shards are dealt by (a slow test weighs more than a quick one)."""
    folder = _fake_tests(tmp_path / "tests", "import time\n\n\ndef test_slow():\n    time.sleep(0.3)\n\n\n"
                                              "def test_quick():\n    pass\n")
    monkeypatch.setattr(suite, "SECONDS", tmp_path / "seconds.json")
    seconds = suite.read_seconds(suite.record_seconds(folder, ("", "light")))
    assert sorted(seconds) == [f"{suite.FILES[0]}::test_{name}" for name in ("quick", "slow")]
    assert seconds[f"{suite.FILES[0]}::test_slow"] >= 0.6  # (at least its 0.3 s of sleep at each of the two levels)


def test_a_recorded_bare_run_stands_in_only_for_the_same_torch_python_and_files(tmp_path, monkeypatch,
                                                                                no_plugin_autoload):
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


def test_an_extension_a_test_builds_is_built_once_in_the_kept_folder_whatever_folder_the_test_names(
        tmp_path, monkeypatch, no_plugin_autoload):
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
        process, outcomes, log = suite._start(folder, "", ["test_build.py"], name)
        assert process.wait() == 0, log.read_text()
        assert json.loads(outcomes.read_text())["test_build.py::test_build"]["outcome"] == "passed"
        return built.stat().st_mtime_ns

    assert built_after_a_run("first") == built_after_a_run("again")  # the second run loaded the first one's build


def test_the_terminal_summary_adds_the_shards_up_into_one_row_per_level():
    impossible = next(iter(suite.IMPOSSIBLE))
    shards = [suite.LevelResult("default", 300, 299, impossible=[impossible]), suite.LevelResult("default", 239, 239),
              suite.LevelResult("light", 270, 270), suite.LevelResult("light", 269, 269)]  # fmt: skip
    shards += [suite.LevelResult(level, 0, 0) for level in LEVELS for _ in range(SHARDS - 2)]  # (the other shards)
    text = summary([f"/tests\n{result.to_json()}" for result in reversed(shards)])  # (light's shards ended first)
    assert text.startswith("/tests (all tests)\n")
    rows = [line for line in text.splitlines() if line.startswith(("| default", "| light"))]
    assert rows == [f"| default | 539 | 538 of 539 | `{suite._short(impossible)}` | 0 |",
                    "| light | 539 | 539 of 539 | none | 0 |"]  # fmt: skip
    assert f"(1 of {len(LEVELS) * SHARDS} shards)" in summary([f"/tests\n{shards[0].to_json()}"])


def test_the_builds_are_kept_outside_the_repository_and_its_environment_and_fall_back_to_the_temporary_folder(
        tmp_path, monkeypatch):
    """A fresh clone makes a new ``.venv``: builds kept there were compiled again (about a minute of the compiler)
    by every fresh clone's test command. They live in the user's cache folder; where that cannot be written, in
    the temporary folder."""
    assert not suite.BUILDS.is_relative_to(suite.ROOT) and not suite.BUILDS.is_relative_to(sys.prefix)
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setattr(suite, "BUILDS", blocked / "builds")  # (a folder inside a file cannot be made)
    folder = suite.builds_folder()
    assert folder.is_dir() and folder.is_relative_to(tempfile.gettempdir()) and folder.name == suite._versions()
