"""Measure graphwatch's diagnoses and its own fixes on code nobody here wrote: precision, recall, line named, clean
silent, fixed twin silent, graphwatch's fix works (and what ``--check-fixes`` said of it).

Usage (from the repo root)::

    .venv/bin/python benchmarks/accuracy/run.py --corpus DIR      # or GRAPHWATCH_CORPUS=DIR
    .venv/bin/python benchmarks/accuracy/run.py                   # the reproductions only
    .venv/bin/python benchmarks/accuracy/run.py --level full ...  # every step in full detail (its table with --out)

Each case runs in a fresh temporary folder as ``python -m graphwatch run --level LEVEL --out OUT SCRIPT ARGS``
(the default level unless ``--level full``), with ``shims/`` on the path (a stand-in torchvision: no CPU
wheel exists here, and nothing can be downloaded).  A real case copies its folder from the corpus and applies its one-line mutation; a
reproduction is a script of ``repros/`` whose docstring says ``EXPECT: silent`` or ``EXPECT: kind[, kind]``,
whose ``# HERE`` comment marks the line a finding must cite, and whose ``FIX: old => new`` lines apply the
known-good fix (``\\n`` in ``new`` starts a new line).  A bug runs with ``--check-fixes``; then its fixed twin
(the known fix: the unchanged script, or the FIX lines), which must be silent, and graphwatch's own fix
(``own_fix.py``), which must print what the twin prints.  The table goes to ``benchmarks/accuracy/RESULTS.md``
(``--out`` to change).
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
from datetime import date
from pathlib import Path

from cases import PROBLEM_KINDS, REAL, Case
from own_fix import apply_own_fix, different, own_fix, printed_numbers

HERE = Path(__file__).resolve().parent
LEVEL = "default"  # graphwatch's level (--level)
REPO = HERE.parent.parent
REPROS = HERE / "repros"
TIMEOUT = float(os.environ.get("GW_ACCURACY_TIMEOUT", "1800"))  # seconds a run may take (a loaded machine is slow)
CONSEQUENCES = {"memory-growth"}  # what a leak also causes: never counted against precision


@dataclass
class Outcome:
    case: Case
    verdict: str  # "silent", "false positive", "named", "wrong line", "missed", "did not run"
    kinds: list[str]
    right: int = 0  # findings of an expected kind (or a consequence of one)
    wrong: int = 0  # findings of another kind
    twin: str = ""  # the known fix: "silent", "finding left", "fails", "" (no fix to try)
    own: str = ""  # graphwatch's fix: "trains the same", "changes training: ...", "fails: ...", "no fix ...", ...
    check: str = ""  # what --check-fixes said of that patch: "checked", "failed", "" (no patch)
    detail: str = ""


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
    shutil.copytree(folder, work, dirs_exist_ok=True)
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


def _run(case: Case, script: Path, out: Path, check_fixes: bool = False) -> Ran:
    import graphwatch

    env = dict(os.environ, **{k: v for k, v in case.env.items() if k != "GW_FIX"})
    env["PYTHONPATH"] = os.pathsep.join([str(HERE / "shims"), str(REPO / "src"), env.get("PYTHONPATH", "")])
    env.setdefault("MPLBACKEND", "Agg")
    env.setdefault("OMP_NUM_THREADS", "1")  # one thread a run: the same numbers on any machine, and cases run side by side
    env.setdefault("GW_ACCURACY_SEED", "0")  # shims/sitecustomize.py seeds scripts that seed nothing
    flags = ["--check-fixes"] if check_fixes else []
    command = [sys.executable, "-m", "graphwatch", "run", "--level", LEVEL, *flags, "--out", str(out), script.name, *case.args]
    try:
        done = subprocess.run(command, cwd=script.parent, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return Ran(-1, [], "timed out")
    trace_path = out / "trace.json"
    if not trace_path.exists():
        return Ran(done.returncode, [], (done.stderr.strip().splitlines() or ["no trace"])[-1], done.stdout)
    findings = [f for f in graphwatch.load(trace_path).findings if f.kind in PROBLEM_KINDS]
    return Ran(done.returncode, findings, done.stderr, done.stdout)


def _cited(findings: list, script: Path, text: str | None, number: int | None = None) -> bool:
    if text is None:
        return True
    numbers = [i for i, line in enumerate(script.read_text().splitlines(), 1) if line.split("#")[0].strip() == text]
    numbers = [n for n in numbers if number is None or n == number]
    wanted = {f"{script.name}:{n}" for n in numbers}
    return any(wanted & set(f.evidence.get("sites", [])) for f in findings)


def judge(case: Case, corpus: Path | None) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="gw-accuracy-") as temp:
        work = Path(temp) / "work"
        work.mkdir()
        script = _prepare(case, corpus, work)
        if script is None:
            return Outcome(case, "did not run", [], detail="not in the corpus")
        bug = _run(case, script, Path(temp) / "out", check_fixes=not case.clean)
        code, findings, stderr = bug.code, bug.findings, bug.stderr
        kinds = [f.kind for f in findings]
        if code == -1 or (not findings and "Traceback" in stderr and not case.expect):
            return Outcome(case, "did not run", kinds, detail=stderr.strip().splitlines()[-1][:120] if stderr else "")
        allowed = set(case.expect) | CONSEQUENCES
        right = sum(k in allowed for k in kinds) if case.expect else 0
        outcome = Outcome(case, "", kinds, right=right, wrong=len(kinds) - right)
        if case.clean:
            outcome.verdict = "silent" if not kinds else "false positive"
            return outcome
        hits = [f for f in findings if f.kind in case.expect]
        named = _cited(hits, script, case.cite, case.cite_line)
        outcome.verdict = "missed" if not hits else ("named" if named else "wrong line")
        outcome.twin, twin_out = _try_fix(case, corpus, Path(temp))
        outcome.own, outcome.check = _try_own_fix(case, corpus, Path(temp), findings, twin_out)
        return outcome


def _try_fix(case: Case, corpus: Path | None, temp: Path) -> tuple[str, str | None]:
    """Apply the known fix (a real case: undo the mutation; a reproduction: its FIX lines) and run again:
    (whether graphwatch is then silent, what the fixed program printed when it exited 0)."""
    fix = case.env.get("GW_FIX")
    if case.source is None and not fix:
        return "", None
    work = temp / "fixed"
    work.mkdir()
    fixed = replace(case, mutation=()) if case.source is not None else case
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


def _try_own_fix(case: Case, corpus: Path | None, temp: Path, findings: list, known: str | None) -> tuple[str, str]:
    """Apply graphwatch's own fix to the bug and compare what it prints with the known fix's output:
    (the verdict, what --check-fixes said of that patch)."""
    fix = own_fix(findings, case.expect)
    if fix is None:
        return "no fix: its fixes are sentences, with no patch or edits to apply", ""
    check = "" if fix.finding.check is None else ("checked" if fix.finding.check.checked else "failed")
    work = temp / "own"
    work.mkdir()
    script = _prepare(case, corpus, work)
    if script is None:
        return "", check
    failure = apply_own_fix(fix, work)
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


# ------------------------------------------------------------------ the table
def table(outcomes: list[Outcome]) -> str:
    ran = [o for o in outcomes if o.verdict != "did not run"]
    bugs = [o for o in ran if not o.case.clean]
    clean = [o for o in ran if o.case.clean]
    detected = [o for o in bugs if o.verdict in ("named", "wrong line")]
    right = sum(o.right for o in ran)
    total = sum(o.right + o.wrong for o in ran)
    twins = [o for o in bugs if o.twin]
    named = [o for o in bugs if o.verdict == "named"]
    works = [o for o in bugs if o.own.startswith("trains the same")]
    changes = [o for o in bugs if o.own.startswith("changes training")]
    offered = [o for o in bugs if o.own and not o.own.startswith("no fix")]
    checked = [o for o in bugs if o.check]
    agrees = [o for o in checked if (o.check == "checked") == o.own.startswith("trains the same")]

    def ratio(a: int, b: int) -> str:
        return f"{a}/{b} = {a / b:.2f}" if b else "n/a"

    lines = [
        "# Accuracy on code nobody here wrote",
        "",
        f"Regenerated {date.today().isoformat()} by `.venv/bin/python benchmarks/accuracy/run.py --corpus DIR` "
        "(real scripts from the repositories named in `cases.py`, at the commits named there; reproductions "
        f"in `repros/`). {LEVEL.capitalize()} level, `graphwatch run` (a bug with `--check-fixes`), one process per run.",
        "",
        "| measure | value |",
        "| --- | --- |",
        f"| precision (findings of the expected kind, growth included) | {ratio(right, total)} |",
        f"| recall (bug programs with a finding of the expected kind) | {ratio(len(detected), len(bugs))} |",
        f"| line named (of those, the expected line cited) | {ratio(len(named), len(detected))} |",
        f"| clean programs silent | {ratio(sum(o.verdict == 'silent' for o in clean), len(clean))} |",
        f"| fixed twin silent (the known fix applied: exit 0, no finding) | "
        f"{ratio(sum(o.twin == 'silent' for o in twins), len(twins))} |",
        f"| graphwatch's fix works (its fix applied: trains as the known fix does) | {ratio(len(works), len(bugs))} |",
        f"| graphwatch's fix changes what trains (worse than no fix) | {ratio(len(changes), len(bugs))} |",
        f"| a fix to apply offered (a patch, or edits) | {ratio(len(offered), len(bugs))} |",
        f"| `--check-fixes` right (\"checked\" exactly when the fix trains the same) | {ratio(len(agrees), len(checked))} |",
        f"| did not run | {len(outcomes) - len(ran)} |",
        "",
        "How a fix is compared: both programs run seeded under `graphwatch run`; every number each prints (losses, "
        "metrics, the trained parameters' sums the reproductions print last) is compared in order, each within one "
        "unit of its last printed digit; timings (`ms/batch`, `time:`) are left out. A fix that exits 0 but prints "
        "other numbers changes what trains.",
        "",
        "| case | source | expected | found | verdict | fixed twin silent | graphwatch's fix | check |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for o in outcomes:
        source = o.case.source.repo if o.case.source else "repro"
        expected = ", ".join(o.case.expect) or "silent"
        found = ", ".join(o.kinds) or "nothing"
        verdict = o.verdict + (f" ({o.detail})" if o.detail else "")
        own = o.own.replace("|", "\\|") or "-"
        lines.append(f"| {o.case.name} | {source} | {expected} | {found} | {verdict} | {o.twin or '-'} | {own} | {o.check or '-'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=os.environ.get("GRAPHWATCH_CORPUS"))
    parser.add_argument("--out", type=Path, default=HERE / "RESULTS.md")
    parser.add_argument("-k", default="", help="only the cases whose name contains this")
    parser.add_argument("-j", type=int, default=1, help="cases run side by side (each run is one thread)")
    parser.add_argument("--level", default="default", choices=("default", "full"), help="graphwatch's level")
    args = parser.parse_args(argv)
    global LEVEL
    LEVEL = args.level
    corpus = Path(args.corpus) if args.corpus else None

    def one(case: Case) -> Outcome:
        outcome = judge(case, corpus)
        found = ", ".join(outcome.kinds) or "-"
        own = f"\n{'':15} own fix: {outcome.own} (check: {outcome.check or '-'})" if outcome.own else ""
        print(f"{outcome.verdict:15} {outcome.twin or '-':13} {case.name}: {found}{own}", flush=True)
        return outcome

    with ThreadPoolExecutor(max_workers=max(1, args.j)) as pool:  # (each case is subprocesses: threads suffice)
        outcomes = list(pool.map(one, [case for case in [*REAL, *repro_cases()] if args.k in case.name]))
    if not args.k and (args.level == "default" or args.out != HERE / "RESULTS.md"):  # (the table is the default's)
        args.out.write_text(table(outcomes))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
