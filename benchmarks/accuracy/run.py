"""Measure graphwatch's diagnoses and its own fixes on code nobody here wrote: precision, recall, line named, clean
silent, fixed twin silent, graphwatch's fix works (and what ``--check-fixes`` said of it).

Usage (from the repo root)::

    .venv/bin/python benchmarks/accuracy/run.py --corpus DIR      # or GRAPHWATCH_CORPUS=DIR
    .venv/bin/python benchmarks/accuracy/run.py                   # the reproductions only
    .venv/bin/python benchmarks/accuracy/run.py --no-full ...     # without the column found at level=full
    .venv/bin/python benchmarks/accuracy/run.py --level full ...  # every step in full detail (its table with --out)

Each case runs in a fresh temporary folder as ``python -m graphwatch run --level LEVEL --out OUT SCRIPT ARGS``
(the default level unless ``--level full``), with ``shims/`` on the path (a stand-in torchvision: no CPU
wheel exists here, and nothing can be downloaded).  A real case copies its folder from the corpus and applies its one-line mutation; a
reproduction is a script of ``repros/`` whose docstring says ``EXPECT: silent`` or ``EXPECT: kind[, kind]``,
whose ``# HERE`` comment marks the line a finding must cite, and whose ``FIX: old => new`` lines apply the
known-good fix (``\\n`` in ``new`` starts a new line).  A bug runs with ``--check-fixes --patch-out FILE``; then
its fixed twin (the known fix: the unchanged script or the case's ``fix`` lines, or the FIX lines), which must be
silent, and graphwatch's own fix (``own_fix.py``: the run's patches together, as FILE has them), which must print
what the twin prints.  At the default level the bug (or clean) program also runs at ``--level full``, for its
diagnosis alone (no fix checks): the table's column "found at level=full" and its row "default level finds what
full finds" (``results.py``).  The table goes to ``benchmarks/accuracy/RESULTS.md`` (written by a run of every
case at the default level; ``--out`` for any other).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from cases import PROBLEM_KINDS, REAL, Case
from more_cases import MORE, MORE_SETUPS
from own_fix import apply_own_fix, different, own_fix, printed_numbers
from results import Outcome, same_diagnosis, table
from tutorials import TUTORIAL_SETUPS, TUTORIALS

HERE = Path(__file__).resolve().parent
LEVEL = "default"  # graphwatch's level (--level)
REPO = HERE.parent.parent
REPROS = HERE / "repros"
TIMEOUT = float(os.environ.get("GW_ACCURACY_TIMEOUT", "1800"))  # seconds a run may take (a loaded machine is slow)
CONSEQUENCES = {"memory-growth"}  # what a leak also causes: never counted against precision


# ------------------------------------------------------------------ data the scripts read
def _wikitext(folder: Path) -> None:
    """A small corpus in wikitext-2's layout (the script's own data is large and not needed here)."""
    rng = random.Random(0)
    words = [f"w{i}" for i in range(300)]
    data = folder / "data" / "wikitext-2"
    data.mkdir(parents=True, exist_ok=True)
    for name, lines in (("train", 300), ("valid", 30), ("test", 30)):
        text = "\n".join(" ".join(rng.choice(words) for _ in range(10)) for _ in range(lines))
        (data / f"{name}.txt").write_text(text + "\n")


def _sine(folder: Path) -> None:
    """generate_sine_wave.py's data, smaller (20 waves of 120 points instead of 100 of 1000)."""
    import numpy as np
    import torch

    rng = np.random.RandomState(2)
    x = np.array(range(120)) + rng.randint(-80, 80, 20).reshape(20, 1)
    torch.save(np.sin(x / 20.0).astype("float64"), str(folder / "traindata.pt"))


def _style_images(folder: Path) -> None:
    """The neural style tutorial's two pictures (128 x 128, made from a seed: nothing can be downloaded)."""
    import numpy as np
    from PIL import Image

    images = folder / "images"
    images.mkdir(exist_ok=True)
    rng = np.random.RandomState(3)
    for name in ("picasso.jpg", "dancing.jpg"):
        Image.fromarray(rng.randint(0, 256, (128, 128, 3), dtype=np.uint8)).save(images / name)


SETUPS = {"wikitext": _wikitext, "sine": _sine, "style_images": _style_images}
SETUPS |= TUTORIAL_SETUPS
SETUPS |= MORE_SETUPS


# ------------------------------------------------------------------ cases from repros/
def repro_cases() -> list[Case]:
    cases = []
    for path in sorted(REPROS.glob("*.py")):
        text = path.read_text()
        expect = re.search(r"EXPECT:\s*([\w\-, ]+)", text)
        if expect is None:
            raise SystemExit(f"{path}: no 'EXPECT:' line in its docstring")
        kinds = tuple(k.strip() for k in expect.group(1).split(",") if k.strip() and k.strip() != "silent")
        marked = [line.split("#")[0].strip() for line in text.splitlines() if line.rstrip().endswith("# HERE")]
        fixes = re.findall(r"^FIX: (.+?) => (.+)$", text, flags=re.MULTILINE)
        mutation = ()
        cases.append(
            Case(
                path.stem,
                None,
                script=path.name,
                expect=kinds,
                cite=marked[0] if marked else None,
                mutation=mutation,
                env={"GW_FIX": "\u0001".join(f"{old}\u0000{new}" for old, new in fixes)} if fixes else {},
            )
        )
    return cases


# ------------------------------------------------------------------ running one case
def _prepare(case: Case, corpus: Path | None, work: Path) -> Path | None:
    if case.source is None:
        shutil.copy(REPROS / case.script, work / case.script)
        return work / case.script
    if corpus is None:
        return None
    folder = corpus / case.source.repo.replace("/", "+") / case.source.folder
    if not folder.is_dir():
        return None
    shutil.copytree(folder, work, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".git"))
    if case.setup:
        SETUPS[case.setup](work)
    script = work / case.source.script
    for old, new in case.mutation:
        _replace_line(script, old, new)
    return script


def _replace_line(script: Path, old: str, new: str) -> None:
    lines = script.read_text().splitlines(keepends=True)
    index = next((i for i, line in enumerate(lines) if line.rstrip("\n") == old), None)
    if index is None:
        raise SystemExit(f"{script.name}: the mutation's line is not there: {old!r}")
    lines[index] = new + "\n"
    script.write_text("".join(lines))


@dataclass
class Ran:
    code: int  # -1: timed out
    findings: list
    stderr: str
    stdout: str = ""
    patches: str = ""  # what --patch-out wrote (a bug's run: every patch of the run, as a user gets them)


def _run(case: Case, script: Path, out: Path, check_fixes: bool = False, level: str | None = None) -> Ran:
    """Run ``script`` under ``graphwatch run`` at ``level`` (the harness's ``LEVEL`` unless given)."""
    import graphwatch

    env = dict(os.environ, **{k: v for k, v in case.env.items() if k != "GW_FIX"})
    env["PYTHONPATH"] = os.pathsep.join([str(HERE / "shims"), str(REPO / "src"), env.get("PYTHONPATH", "")])
    env.setdefault("MPLBACKEND", "Agg")
    env.setdefault("OMP_NUM_THREADS", "1")  # one thread a run: the same numbers on any machine, and cases run side by side
    env.setdefault("GW_ACCURACY_SEED", "0")  # shims/sitecustomize.py seeds scripts that seed nothing
    patch_out = out.parent / f"{out.name}-patches.diff"
    flags = ["--check-fixes", "--patch-out", str(patch_out)] if check_fixes else []
    command = [sys.executable, "-m", "graphwatch", "run", "--level", level or LEVEL, *flags, "--out", str(out),
               script.name, *case.args]
    try:
        done = subprocess.run(command, cwd=script.parent, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return Ran(-1, [], "timed out")
    trace_path = out / "trace.json"
    if not trace_path.exists():
        return Ran(done.returncode, [], (done.stderr.strip().splitlines() or ["no trace"])[-1], done.stdout)
    findings = [f for f in graphwatch.load(trace_path).findings if f.kind in PROBLEM_KINDS]
    patches = patch_out.read_text() if patch_out.is_file() else ""
    return Ran(done.returncode, findings, done.stderr, done.stdout, patches)


def _cited(findings: list, script: Path, text: str | None, number: int | None = None) -> bool:
    if text is None:
        return True
    numbers = [i for i, line in enumerate(script.read_text().splitlines(), 1) if line.split("#")[0].strip() == text]
    numbers = [n for n in numbers if number is None or n == number]
    wanted = {f"{script.name}:{n}" for n in numbers}
    return any(wanted & set(f.evidence.get("sites", [])) for f in findings)


def _diagnose(case: Case, ran: Ran, script: Path) -> Outcome:
    """The verdict on one run of the case's bug (or clean) program: its findings against the expected answer."""
    kinds = [f.kind for f in ran.findings]
    if ran.code == -1 or (not ran.findings and "Traceback" in ran.stderr and not case.expect):
        detail = ran.stderr.strip().splitlines()[-1][:120] if ran.stderr.strip() else ""
        return Outcome(case, "did not run", kinds, detail=detail)
    allowed = set(case.expect) | CONSEQUENCES
    right = sum(k in allowed for k in kinds) if case.expect else 0
    outcome = Outcome(case, "", kinds, right=right, wrong=len(kinds) - right)
    if case.clean:
        outcome.verdict = "silent" if not kinds else "false positive"
        return outcome
    hits = [f for f in ran.findings if f.kind in case.expect]
    named = _cited(hits, script, case.cite, case.cite_line)
    outcome.verdict = "missed" if not hits else ("named" if named else "wrong line")
    return outcome


def judge(case: Case, corpus: Path | None, compare_full: bool = False, fixes: bool = True) -> Outcome:
    """Run the case at ``LEVEL`` (with ``fixes``, a bug with --check-fixes, then its fixed twin and graphwatch's
    own fix) and, with ``compare_full``, its bug (or clean) program again at level="full" for the diagnosis alone."""
    with tempfile.TemporaryDirectory(prefix="gw-accuracy-") as temp:
        work = Path(temp) / "work"
        work.mkdir()
        script = _prepare(case, corpus, work)
        if script is None:
            return Outcome(case, "did not run", [], detail="not in the corpus")
        bug = _run(case, script, Path(temp) / "out", check_fixes=fixes and not case.clean)
        outcome = _diagnose(case, bug, script)
        if fixes and outcome.verdict != "did not run" and not case.clean:
            outcome.twin, twin_out = _try_fix(case, corpus, Path(temp))
            outcome.own, outcome.check = _try_own_fix(case, corpus, Path(temp), bug, twin_out)
        if compare_full:
            outcome.full = _diagnose_at_full(case, corpus, Path(temp))
        return outcome


def _diagnose_at_full(case: Case, corpus: Path | None, temp: Path) -> Outcome:
    """The bug (or clean) program, freshly prepared, run at level="full": its diagnosis only."""
    work = temp / "full"
    work.mkdir()
    script = _prepare(case, corpus, work)
    if script is None:
        return Outcome(case, "did not run", [], detail="not in the corpus")
    return _diagnose(case, _run(case, script, temp / "full-out", level="full"), script)


def _try_fix(case: Case, corpus: Path | None, temp: Path) -> tuple[str, str | None]:
    """Apply the known fix (a real case: undo the mutation, or apply its ``fix`` lines; a reproduction: its FIX
    lines) and run again: (whether graphwatch is then silent, what the fixed program printed when it exited 0)."""
    fix = case.env.get("GW_FIX")
    if case.source is None and not fix:
        return "", None
    work = temp / "fixed"
    work.mkdir()
    fixed = replace(case, mutation=case.fix) if case.source is not None else case
    script = _prepare(fixed, corpus, work)
    if script is None:
        return "", None
    for pair in fix.split("\u0001") if fix else ():
        old, new = pair.split("\u0000")
        text = script.read_text()
        if old not in text:
            return "fix not applicable", None
        head, _, tail = text.rpartition(old)  # the code's line, not the docstring's FIX line
        script.write_text(head + new.replace("\\n", "\n") + tail)
    ran = _run(fixed, script, temp / "fixed-out")
    if ran.code != 0:
        return "fails", None
    return ("silent" if not ran.findings else "finding left"), ran.stdout


def _try_own_fix(case: Case, corpus: Path | None, temp: Path, bug: Ran, known: str | None) -> tuple[str, str]:
    """Apply graphwatch's own fix to the bug (every patch of its run together, as --patch-out wrote them) and
    compare what it prints with the known fix's output: (the verdict, what --check-fixes said of those patches)."""
    fix = own_fix(bug.findings, case.expect, bug.patches)
    if isinstance(fix, str):  # none to apply: every patch failed its check, or no finding has one
        return fix, "failed" if any(f.patch for f in bug.findings) else ""
    check = fix.check
    work = temp / "own"
    work.mkdir()
    script = _prepare(case, corpus, work)
    if script is None:
        return "", check
    failure = apply_own_fix(fix, script.parent)  # where it ran: its patches are relative to that folder
    if failure is not None:
        return f"not applied ({fix.how}): {failure}", check
    ran = _run(case, script, temp / "own-out")
    if ran.code != 0:
        last = (ran.stderr.strip().splitlines() or ["?"])[-1]
        return f"fails ({fix.how}): {last[:100]}", check
    if known is None:
        return f"runs ({fix.how}); the known fix gave nothing to compare with", check
    changed = different(printed_numbers(ran.stdout), printed_numbers(known))
    if changed is not None:
        return f"changes training ({fix.how}): {changed}", check
    if any(f.kind in case.expect for f in ran.findings):
        return f"finding left ({fix.how})", check
    return f"trains the same ({fix.how})", check


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=os.environ.get("GRAPHWATCH_CORPUS"))
    parser.add_argument("--out", type=Path, default=HERE / "RESULTS.md")
    parser.add_argument("-k", default="", help="only the cases whose name contains this")
    parser.add_argument("-j", type=int, default=1, help="cases run side by side (each run is one thread)")
    parser.add_argument("--level", default="default", choices=("default", "full"), help="graphwatch's level")
    parser.add_argument("--no-full", action="store_true",
                        help="at the default level, leave out the column found at level=full (half the bug runs)")
    parser.add_argument("--no-fixes", action="store_true",
                        help="diagnoses only: no --check-fixes, no fixed twin, no graphwatch's fix (a quick check)")
    args = parser.parse_args(argv)
    global LEVEL
    LEVEL = args.level
    corpus = Path(args.corpus) if args.corpus else None
    compare_full = args.level == "default" and not args.no_full

    def one(case: Case) -> Outcome:
        outcome = judge(case, corpus, compare_full, fixes=not args.no_fixes)
        found = ", ".join(outcome.kinds) or "-"
        own = f"\n{'':15} own fix: {outcome.own} (check: {outcome.check or '-'})" if outcome.own else ""
        full = ""
        if outcome.full is not None:
            mark = "same" if same_diagnosis(outcome, outcome.full) else "DIFFERS"
            full = f"\n{'':15} at full ({mark}): {outcome.full.verdict}: {', '.join(outcome.full.kinds) or '-'}"
        print(f"{outcome.verdict:15} {outcome.twin or '-':13} {case.name}: {found}{own}{full}", flush=True)
        return outcome

    with ThreadPoolExecutor(max_workers=max(1, args.j)) as pool:  # (each case is subprocesses: threads suffice)
        outcomes = list(pool.map(one, [case for case in [*REAL, *TUTORIALS, *MORE, *repro_cases()] if args.k in case.name]))
    # RESULTS.md is the whole corpus at the default level (the levels compared); another table needs --out
    if args.out != HERE / "RESULTS.md" or (not args.k and compare_full and not args.no_fixes):
        args.out.write_text(table(outcomes, LEVEL, fixes=not args.no_fixes))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
