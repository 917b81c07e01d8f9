"""PyTorch's own autograd tests, run bare and with every test inside a graphwatch session, compared.

``python scripts/pytorch_suite/suite.py [--tests DIR] [--write-doc] [LEVEL ...]`` copies the test folder
(default: ``../shared/pytorch-tests`` beside the repository; a read-only reference copy, never part of
graphwatch) to a temporary folder, runs its files with pytest once bare and once per graphwatch level (all
at once, one process each), and prints one row per level: tests passing bare, how many of them pass
watched, the proven impossibilities, and every other test that passes bare and not watched (or the
reverse).  Exits 1 when there is such a test, 0 otherwise, also when the folder is absent (one line says
so).  ``--write-doc`` puts the table into ``docs/pytorch-suite.md``.

The tests run inside a session through the pytest plugin ``graphwatch_everywhere`` (this folder).  The bare
run's outcomes are recorded per torch and Python version (``bare/``, ``--record-bare``): where a record matches
this torch, this Python and the test files byte for byte, it stands in for the bare run (``--run-bare`` runs it
anyway); a test whose outcome then differs still runs again, bare and watched, before it counts.  The C++
extension a test compiles is built once per machine, torch and Python, in the user's cache folder
(``$XDG_CACHE_HOME/graphwatch/pytorch-suite-builds``, by default under ``~/.cache``), and shared by the runs
(``BUILDS``): a minute of compiling the first time, none after, also for a fresh clone with a new ``.venv``.

A run can be one shard of the tests (``shard=(i, n)``, see ``in_shard``: the tests recorded in ``bare/seconds.json``
dealt longest first into ``n`` shards of about the same time, any other test by a hash of its id), compared with
the same shard of the bare run: the test command spreads the levels and shards over its workers
(``tests/test_pytorch_suite.py``) and ``merge`` adds the shards' results up into one row per level.
``--record-seconds`` records each test's seconds inside a session, added up over the levels run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DEFAULT_FOLDER = ROOT.parent / "shared" / "pytorch-tests"
DOC = ROOT / "docs" / "pytorch-suite.md"
LEVELS = ("default", "light", "precise")
# test_autograd.py imports and so runs the classes of autograd/test_complex.py and autograd/test_logging.py
FILES = ("test_autograd.py", "autograd/test_node_lifecycle.py")
WITH_PACK_HOOKS = frozenset({"default", "precise"})

# Tests no graphwatch level can pass, each with the levels it fails at and why (docs/pytorch-suite.md proves it).
IMPOSSIBLE: dict[str, tuple[frozenset[str], str]] = {
    "test_autograd.py::TestAutograd::test_no_unnecessary_unwrapping": (
        WITH_PACK_HOOKS,
        "asserts `grad_fn._saved_self is a`; torch re-wraps whatever an unpack hook returns",
    ),
}
# Tests that crash PyTorch itself now and then, bare as inside a session: left out of every run, each with what
# shows it (docs/pytorch-suite.md).  A run that dies compares nothing, so one such crash would hide every result.
CRASH_TORCH: dict[str, str] = {
    "test_autograd.py::TestAutograd::test_profiler_propagation": (
        "segfaults torch 2.13 now and then without graphwatch (the profiler's results against a `torch.jit._fork` "
        "continuation on another thread): its body run 100 times a process crashed 2 of 31 bare processes, and "
        "5 of 15 under `saved_tensors_hooks(lambda t: t, lambda t: t)`, which any saved-tensor hooks make likelier"
    ),
}
DOC_BEGIN, DOC_END = "<!-- suite table: begin -->", "<!-- suite table: end -->"
BARE_RECORDS = HERE / "bare"  # the bare run's outcomes, one file per torch and Python version
SECONDS = BARE_RECORDS / "seconds.json"  # each test's seconds inside a session, the levels added up (in_shard)


# Where the runs build the C++ extensions PyTorch's tests compile (graphwatch_everywhere.py): kept outside the
# repository and its environment, so that a build (a minute of the compiler's CPU) is paid once per machine, torch
# and Python, and shared by the runs started together (one builds, the others wait) and by later clones.
BUILDS = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "graphwatch" / "pytorch-suite-builds"
MISSING = (
    "PyTorch's autograd tests not run: no shared/pytorch-tests beside the repository. They are PyTorch's own test "
    "files (test/test_autograd.py and test/autograd/ of the pytorch/pytorch repository), never part of graphwatch: "
    "docs/pytorch-suite.md ('Getting the tests') lists the files and commits; put them in ../shared/pytorch-tests "
    "or run `bash scripts/pytorch_suite.sh --tests DIR`"
)


@dataclass
class LevelResult:
    """One level's comparison with the bare run."""

    level: str
    passed_bare: int
    passed_watched: int  # of the tests that pass bare
    impossible: list[str] = field(default_factory=list)  # pass bare, not watched, and listed in IMPOSSIBLE
    broken: list[tuple[str, str]] = field(default_factory=list)  # (test, outcome: detail), not listed
    mended: list[str] = field(default_factory=list)  # pass watched only
    stale: list[str] = field(default_factory=list)  # listed in IMPOSSIBLE for this level, yet they pass
    flaky: list[tuple[str, str]] = field(default_factory=list)  # (test, what happened): differed once, not again

    def recheck(self, bare: dict, watched: dict, bare_again: dict, watched_again: dict) -> None:
        """Keep as differences only the tests that differ again; the others are flaky, and count as they ran
        the second time (a test that timed out bare on a loaded machine and then passed both ways passes)."""
        again = compare(self.level, bare_again, watched_again)
        still = {test for test, _ in again.broken} | set(again.mended)
        for test in [test for test, _ in self.broken] + self.mended:
            if test in still:
                continue
            first = f"bare {_outcome(bare, test)}, watched {_outcome(watched, test)}"
            self.flaky.append((test, f"{first}; run again: both {_outcome(bare_again, test)}"))
            if _outcome(bare_again, test) == "passed":  # (and so did the watched run: they agree)
                if _outcome(bare, test) != "passed":
                    self.passed_bare += 1
                self.passed_watched += 1
        self.broken = [(test, detail) for test, detail in self.broken if test in still]
        self.mended = [test for test in self.mended if test in still]

    @property
    def unexpected(self) -> bool:
        """A difference not on the list, or a listed impossibility that passes (the list is then wrong)."""
        return bool(self.broken or self.mended or self.stale)

    def to_json(self) -> str:
        """The result as JSON, as a shard's test sends it to the terminal summary (``from_json`` reads it)."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> LevelResult:
        data = json.loads(text)
        pairs = {name: [(test, what) for test, what in data[name]] for name in ("broken", "flaky")}
        return cls(**{**data, **pairs})


def merge(results: list[LevelResult]) -> list[LevelResult]:
    """The shards' results added up: one result per level, in the order the levels first appear."""
    merged: dict[str, LevelResult] = {}
    for r in results:
        total = merged.setdefault(r.level, LevelResult(r.level, 0, 0))
        total.passed_bare += r.passed_bare
        total.passed_watched += r.passed_watched
        for name in ("impossible", "broken", "mended", "stale", "flaky"):
            setattr(total, name, sorted(getattr(total, name) + getattr(r, name)))
    return list(merged.values())


def read_seconds(path: Path) -> dict[str, float]:
    """The recorded seconds of each test (``SECONDS``), or none where there is no record."""
    return json.loads(path.read_text()) if path.is_file() else {}


def deal(seconds: dict[str, float], count: int) -> dict[str, int]:
    """The shard of ``count`` of each test of ``seconds``: longest first, each to the shard with the fewest seconds
    so far (the lowest index of equals), so that the shards take about the same time."""
    totals, dealt = [0.0] * count, {}
    for test, took in sorted(seconds.items(), key=lambda item: (-item[1], item[0])):
        dealt[test] = totals.index(min(totals))
        totals[dealt[test]] += took
    return dealt


def in_shard(test: str, shard: tuple[int, int] | None, dealt: dict[str, int] | None = None) -> bool:
    """Whether ``test`` (a pytest id) is in shard ``(i, n)`` (every test when ``shard`` is None): its shard in
    ``dealt`` (``deal`` of the recorded seconds), else where crc32 of its id is ``i`` modulo ``n``.  The id and the
    record alone decide, so that the bare record splits as the run does."""
    return shard is None or (dealt or {}).get(test, zlib.crc32(test.encode()) % shard[1]) == shard[0]


def find_folder(folder: str | os.PathLike[str] | None = None) -> Path | None:
    """The test folder, or None if absent: ``folder`` if given, else ``shared/pytorch-tests`` beside the
    repository (``../shared/pytorch-tests``) or beside a folder above it (a git worktree's ``../../shared``)."""
    candidates = [Path(folder)] if folder is not None else [p / "shared" / "pytorch-tests" for p in ROOT.parents]
    return next((path for path in candidates if (path / FILES[0]).is_file()), None)


def writable_copy(folder: Path) -> Path:
    """A copy of ``folder`` that pytest and Python can write caches into (the original may be read-only)."""
    copy = Path(tempfile.mkdtemp(prefix="graphwatch-pytorch-tests-")) / "tests"
    shutil.copytree(folder, copy, copy_function=shutil.copyfile)
    for path in [copy, *copy.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)
    return copy


def _start(copy: Path, level: str, tests: list[str], name: str,
           shard: tuple[int, int] | None = None) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """One pytest process over ``tests`` in ``copy``, bare (``level=""``) or with every test in a session; only
    the tests of ``shard`` where one is named."""
    outcomes, log = copy.parent / f"{name}.json", copy.parent / f"{name}.log"
    paths = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": paths, "GRAPHWATCH_SUITE_LEVEL": level, "GRAPHWATCH_SUITE_OUTCOMES": str(outcomes),
           "GRAPHWATCH_SUITE_BUILDS": str(builds_folder()),
           "GRAPHWATCH_SUITE_SHARD": "/".join(map(str, shard or ())),  # (empty: every test)
           "GRAPHWATCH_SUITE_SECONDS": str(SECONDS),  # (how the shards are dealt)
           # one torch intra-op thread each (unless set): the runs share the cores, where more would only spin
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}  # fmt: skip
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "graphwatch_everywhere",
               *[arg for test in CRASH_TORCH for arg in ("--deselect", test)]]  # fmt: skip
    with open(log, "w") as output:
        process = subprocess.Popen([*command, "-p", "no:graphwatch", *tests], cwd=copy, env=env, stdout=output,
                                   stderr=subprocess.STDOUT)  # fmt: skip
    return process, outcomes, log


def _versions() -> str:
    """This torch's and this Python's versions, as the bare records and the builds are named by them."""
    import torch

    return f"torch-{torch.__version__}-py{sys.version_info[0]}.{sys.version_info[1]}"


def builds_folder() -> Path:
    """The folder the runs build PyTorch's test extensions in, one per torch and Python version (created): in
    ``BUILDS``, or in the temporary folder where that cannot be written."""
    for base in (BUILDS, Path(tempfile.gettempdir()) / "graphwatch-suite-builds"):
        folder = base / _versions()
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(folder, os.W_OK):
            return folder
    raise RuntimeError(f"no writable folder to build PyTorch's test extensions in: {BUILDS} nor the temporary one")


def _outcomes(runs: dict[str, tuple[subprocess.Popen[bytes], Path, Path]]) -> dict[str, dict[str, dict[str, str]]]:
    """Wait for every run; each one's outcomes (test id -> {"outcome", "detail"})."""
    results = {}
    for level, (process, outcomes, log) in runs.items():
        process.wait()
        if not outcomes.is_file():
            kept = Path(tempfile.gettempdir()) / f"graphwatch-pytorch-suite-{log.name}"
            shutil.copyfile(log, kept)
            raise RuntimeError(f"the {level or 'bare'} run ended before pytest's end (exit code {process.returncode}); "
                               f"its output is in {kept}:\n{_crash_lines(log.read_text())}")  # fmt: skip
        results[level] = json.loads(outcomes.read_text())
    return results


def _crash_lines(output: str) -> str:
    """What a pytest run that died says of it: Python's fatal error and the frames of the test files."""
    lines = output.splitlines()
    fatal = [i for i, line in enumerate(lines) if line.startswith("Fatal Python error")]
    tests = [line for line in lines[fatal[0] if fatal else 0 :] if any(f"{f}\"" in line for f in FILES)]
    return "\n".join([lines[i] for i in fatal] + tests or lines[-20:])


def bare_record(folder: Path) -> Path:
    """Where the bare run's outcomes for this torch and Python are recorded (whether or not the file exists)."""
    return BARE_RECORDS / f"{_versions()}.json"


def _fingerprint(folder: Path) -> str:
    """sha256 of every file the runs read from ``folder`` (the test files, their helpers, the expect files)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def recorded_bare(folder: Path) -> dict[str, dict[str, str]] | None:
    """The recorded bare outcomes, if a record exists for this torch and Python and the same files; else None."""
    record = bare_record(folder)
    if not record.is_file():
        return None
    data = json.loads(record.read_text())
    return data["outcomes"] if data.get("files") == _fingerprint(folder) else None


def record_bare(folder: Path, outcomes: dict[str, dict[str, str]]) -> Path:
    """Record ``outcomes`` of a bare run of ``folder`` for this torch and Python; the record's path."""
    record = bare_record(folder)
    record.parent.mkdir(exist_ok=True)
    kept = {test: {"outcome": result["outcome"], "detail": result["detail"]} for test, result in outcomes.items()}
    record.write_text(json.dumps({"files": _fingerprint(folder), "outcomes": kept}, indent=1, sort_keys=True) + "\n")
    return record


def run_once(folder: Path, level: str) -> dict[str, dict]:
    """The outcomes of one run of every test of ``folder``, bare (``level=""``) or at ``level``."""
    copy = writable_copy(folder)
    try:
        return _outcomes({level: _start(copy, level, list(FILES), level or "bare")})[level]
    finally:
        shutil.rmtree(copy.parent, ignore_errors=True)


def record_seconds(folder: Path, levels: tuple[str, ...]) -> Path:
    """Run every test at each of ``levels`` in turn and record its seconds, added up over them (``SECONDS``)."""
    runs = [run_once(folder, level) for level in levels]
    tests = sorted({test for outcomes in runs for test in outcomes})
    SECONDS.write_text(json.dumps({test: round(sum(run.get(test, {}).get("seconds", 0.0) for run in runs), 2)
                                   for test in tests}, indent=1) + "\n")  # fmt: skip
    return SECONDS


def run_and_compare(
    folder: Path, levels: tuple[str, ...], files: tuple[str, ...] = FILES, run_bare: bool = False,
    shard: tuple[int, int] | None = None,
) -> list[LevelResult]:
    """Run ``files`` at each level (all at once) and compare each level with the bare run: the recorded one
    where it matches (``recorded_bare``), else a bare run beside the others (always with ``run_bare``).  With
    ``shard``, only that shard's tests run and count (``in_shard``).

    A test whose outcome differs runs once more, bare and watched: where the two then agree (a test that
    timed out on a loaded machine, say) it is listed as flaky, not as a difference.
    """
    recorded = None if run_bare else recorded_bare(folder)
    copy = writable_copy(folder)
    try:
        runs = ("", *levels) if recorded is None else levels
        outcomes = _outcomes({level: _start(copy, level, list(files), level or "bare", shard) for level in runs})
        if recorded is not None:
            dealt = deal(read_seconds(SECONDS), shard[1]) if shard else None
            outcomes[""] = {test: outcome for test, outcome in recorded.items() if in_shard(test, shard, dealt)}
        results = [compare(level, outcomes[""], outcomes[level]) for level in levels]
        for result in results:
            differing = [test for test, _ in result.broken] + result.mended
            if not differing:
                continue
            again = _outcomes({
                level: _start(copy, level, differing, f"{result.level}-again-{level or 'bare'}")
                for level in ("", result.level)
            })  # fmt: skip
            result.recheck(outcomes[""], outcomes[result.level], again[""], again[result.level])
        return results
    finally:
        shutil.rmtree(copy.parent, ignore_errors=True)


def compare(level: str, bare: dict[str, dict], watched: dict[str, dict]) -> LevelResult:
    passed = {test for test, result in bare.items() if result["outcome"] == "passed"}
    result = LevelResult(level, len(passed), 0)
    for test in sorted(passed):
        outcome = watched.get(test, {"outcome": "missing", "detail": ""})
        impossible_at = IMPOSSIBLE.get(test, (frozenset(), ""))[0]
        if outcome["outcome"] == "passed":
            result.passed_watched += 1
            if level in impossible_at:
                result.stale.append(test)
        elif level in impossible_at:
            result.impossible.append(test)
        else:
            result.broken.append((test, f"{outcome['outcome']}: {outcome['detail']}"))
    result.mended = sorted(t for t, r in watched.items() if r["outcome"] == "passed" and t in bare and t not in passed)
    return result


def _outcome(outcomes: dict, test: str) -> str:
    return str(outcomes.get(test, {"outcome": "missing"})["outcome"])


def _short(test: str) -> str:
    return test.rsplit("::", 1)[-1]


def table(results: list[LevelResult]) -> str:
    """The comparison as a Markdown table, then the impossibilities with their reasons."""
    rows = [
        "| level | pass bare | of them pass inside a session | proven impossible | other differences |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in results:
        impossible = ", ".join(f"`{_short(t)}`" for t in r.impossible) or "none"
        others = len(r.broken) + len(r.mended)
        rows.append(f"| {r.level} | {r.passed_bare} | {r.passed_watched} of {r.passed_bare} | {impossible} | "
                    f"{'**' + str(others) + '**' if others else 0} |")  # fmt: skip
    listed = sorted({t for r in results for t in r.impossible})
    notes = [f"- `{_short(t)}` ({', '.join(sorted(IMPOSSIBLE[t][0]))}): {IMPOSSIBLE[t][1]}." for t in listed]
    notes += [f"- flaky at {r.level}: `{_short(t)}` differed once, not when run again." for r in results for t, _ in r.flaky]
    notes += [f"- left out of every run: `{_short(t)}`: {why}." for t, why in CRASH_TORCH.items()]
    return "\n".join(rows + (["", *notes] if notes else []))


def report(results: list[LevelResult]) -> str:
    """What the test command prints: the table, then each unexpected or stale test."""
    lines = [table(results)]
    for r in results:
        lines += [f"  {r.level}: DIFFERENT {test}: {detail}" for test, detail in r.broken]
        lines += [f"  {r.level}: passes only inside a session: {test}" for test in r.mended]
        lines += [f"  {r.level}: listed as impossible, yet passes (update IMPOSSIBLE): {test}" for test in r.stale]
        lines += [f"  {r.level}: flaky, differed once, not when run again: {test}: {what}" for test, what in r.flaky]
    return "\n".join(lines)


def write_doc(results: list[LevelResult], doc: Path = DOC) -> None:
    """Replace the table between the markers of ``doc`` with this run's (dated, with the versions)."""
    import torch

    import graphwatch

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    header = (f"torch {torch.__version__}, Python {platform.python_version()}, graphwatch {graphwatch.__version__} "
              f"at `{commit.stdout.strip() or 'unknown'}`; files: {', '.join(f'`{f}`' for f in FILES)}")  # fmt: skip
    text = doc.read_text()
    pattern = re.compile(re.escape(DOC_BEGIN) + ".*?" + re.escape(DOC_END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{doc} has no {DOC_BEGIN} ... {DOC_END} markers")
    doc.write_text(pattern.sub(lambda _: f"{DOC_BEGIN}\n{header}\n\n{table(results)}\n{DOC_END}", text))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("levels", nargs="*", metavar="LEVEL", help=f"graphwatch levels: {', '.join(LEVELS)} (all)")
    parser.add_argument("--tests", help=f"the folder of PyTorch's test files (default: {DEFAULT_FOLDER})")
    parser.add_argument("--write-doc", action="store_true", help=f"put the table into {DOC.relative_to(ROOT)}")
    parser.add_argument("--run-bare", action="store_true", help="run the bare pass even where a record matches")
    parser.add_argument("--record-bare", action="store_true",
                        help="run the bare pass alone first and record its outcomes for this torch and Python")  # fmt: skip
    parser.add_argument("--record-seconds", action="store_true",
                        help="run each level alone first and record each test's seconds (the shards' balance)")  # fmt: skip
    args = parser.parse_args(argv)
    unknown = sorted(set(args.levels) - set(LEVELS))
    if unknown:
        parser.error(f"unknown level {', '.join(unknown)}: use {', '.join(LEVELS)}")
    folder = find_folder(args.tests)
    if folder is None:
        print(f"pytorch suite: skipped: no {FILES[0]} in {args.tests or DEFAULT_FOLDER}. {MISSING}")
        return 0
    levels = tuple(args.levels) or LEVELS
    print(f"pytorch suite: {', '.join(FILES)} from {folder}, bare and at {', '.join(levels)}", flush=True)
    if args.record_bare:
        record = record_bare(folder, run_once(folder, ""))
        print(f"pytorch suite: the bare run's outcomes recorded in {record.relative_to(ROOT)}")
    if args.record_seconds:
        print(f"pytorch suite: each test's seconds recorded in {record_seconds(folder, levels).relative_to(ROOT)}")
    results = run_and_compare(folder, levels, run_bare=args.run_bare)
    print(report(results))
    if args.write_doc:
        write_doc(results)
    return 1 if any(r.unexpected for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
