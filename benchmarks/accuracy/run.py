"""Measure graphwatch's diagnoses on code nobody here wrote: precision, recall, line named, clean silent, fix works.

Usage (from the repo root)::

    .venv/bin/python benchmarks/accuracy/run.py --corpus DIR      # or GRAPHWATCH_CORPUS=DIR
    .venv/bin/python benchmarks/accuracy/run.py                   # the reproductions only

Each case runs in a fresh temporary folder as ``python -m graphwatch run --out OUT SCRIPT ARGS`` (the default
level), with ``shims/`` on the path (a stand-in torchvision: no CPU wheel exists here, and nothing can be
downloaded).  A real case copies its folder from the corpus and applies its one-line mutation; a
reproduction is a script of ``repros/`` whose docstring says ``EXPECT: silent`` or ``EXPECT: kind[, kind]``,
whose ``# HERE`` comment marks the line a finding must cite, and whose ``FIX: old => new`` lines apply the
fix graphwatch suggests (``\\n`` in ``new`` starts a new line).  The table goes to
``benchmarks/accuracy/RESULTS.md`` (``--out`` to change).
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
from dataclasses import dataclass, replace
from datetime import date
from pathlib import Path

from cases import PROBLEM_KINDS, REAL, Case

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
REPROS = HERE / "repros"
TIMEOUT = 600
CONSEQUENCES = {"memory-growth"}  # what a leak also causes: never counted against precision


@dataclass
class Outcome:
    case: Case
    verdict: str  # "silent", "false positive", "named", "wrong line", "missed", "did not run"
    kinds: list[str]
    right: int = 0  # findings of an expected kind (or a consequence of one)
    wrong: int = 0  # findings of another kind
    fix: str = ""  # "works", "finding left", "fails", "" (no fix to try)
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


SETUPS = {"wikitext": _wikitext, "sine": _sine}


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


def _run(case: Case, script: Path, out: Path) -> tuple[int, list, str]:
    import graphwatch

    env = dict(os.environ, **{k: v for k, v in case.env.items() if k != "GW_FIX"})
    env["PYTHONPATH"] = os.pathsep.join([str(HERE / "shims"), str(REPO), env.get("PYTHONPATH", "")])
    env.setdefault("MPLBACKEND", "Agg")
    command = [sys.executable, "-m", "graphwatch", "run", "--out", str(out), script.name, *case.args]
    try:
        done = subprocess.run(command, cwd=script.parent, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return -1, [], "timed out"
    trace_path = out / "trace.json"
    if not trace_path.exists():
        return done.returncode, [], (done.stderr.strip().splitlines() or ["no trace"])[-1]
    findings = [f for f in graphwatch.load(trace_path).findings if f.kind in PROBLEM_KINDS]
    return done.returncode, findings, done.stderr


def _cited(findings: list, script: Path, text: str | None) -> bool:
    if text is None:
        return True
    numbers = [i for i, line in enumerate(script.read_text().splitlines(), 1) if line.split("#")[0].strip() == text]
    wanted = {f"{script.name}:{n}" for n in numbers}
    return any(wanted & set(f.evidence.get("sites", [])) for f in findings)


def judge(case: Case, corpus: Path | None) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="gw-accuracy-") as temp:
        work = Path(temp) / "work"
        work.mkdir()
        script = _prepare(case, corpus, work)
        if script is None:
            return Outcome(case, "did not run", [], detail="not in the corpus")
        code, findings, stderr = _run(case, script, Path(temp) / "out")
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
        outcome.verdict = "missed" if not hits else ("named" if _cited(hits, script, case.cite) else "wrong line")
        outcome.fix = _try_fix(case, corpus, Path(temp))
        return outcome


def _try_fix(case: Case, corpus: Path | None, temp: Path) -> str:
    """Apply the fix (a real case: undo the mutation; a reproduction: its FIX line) and run again."""
    fix = case.env.get("GW_FIX")
    if case.source is None and not fix:
        return ""
    work = temp / "fixed"
    work.mkdir()
    fixed = replace(case, mutation=()) if case.source is not None else case
    script = _prepare(fixed, corpus, work)
    if script is None:
        return ""
    for pair in fix.split("\u0001") if fix else ():
        old, new = pair.split("\u0000")
        text = script.read_text()
        if old not in text:
            return "fix not applicable"
        head, _, tail = text.rpartition(old)  # the code's line, not the docstring's FIX line
        script.write_text(head + new.replace("\\n", "\n") + tail)
    code, findings, _ = _run(fixed, script, temp / "fixed-out")
    if code != 0:
        return "fails"
    return "works" if not findings else "finding left"


# ------------------------------------------------------------------ the table
def table(outcomes: list[Outcome]) -> str:
    ran = [o for o in outcomes if o.verdict != "did not run"]
    bugs = [o for o in ran if not o.case.clean]
    clean = [o for o in ran if o.case.clean]
    detected = [o for o in bugs if o.verdict in ("named", "wrong line")]
    right = sum(o.right for o in ran)
    total = sum(o.right + o.wrong for o in ran)
    fixes = [o for o in bugs if o.fix]
    named = [o for o in bugs if o.verdict == "named"]

    def ratio(a: int, b: int) -> str:
        return f"{a}/{b} = {a / b:.2f}" if b else "n/a"

    lines = [
        "# Accuracy on code nobody here wrote",
        "",
        f"Regenerated {date.today().isoformat()} by `.venv/bin/python benchmarks/accuracy/run.py --corpus DIR` "
        "(real scripts from the repositories named in `cases.py`, at the commits named there; reproductions "
        "in `repros/`). Default level, `graphwatch run`, one process per case.",
        "",
        "| measure | value |",
        "| --- | --- |",
        f"| precision (findings of the expected kind, growth included) | {ratio(right, total)} |",
        f"| recall (bug programs with a finding of the expected kind) | {ratio(len(detected), len(bugs))} |",
        f"| line named (of those, the expected line cited) | {ratio(len(named), len(detected))} |",
        f"| clean programs silent | {ratio(sum(o.verdict == 'silent' for o in clean), len(clean))} |",
        f"| fix works (fixed program silent, exit 0) | {ratio(sum(o.fix == 'works' for o in fixes), len(fixes))} |",
        f"| did not run | {len(outcomes) - len(ran)} |",
        "",
        "| case | source | expected | found | verdict | fix |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for o in outcomes:
        source = o.case.source.repo if o.case.source else "repro"
        expected = ", ".join(o.case.expect) or "silent"
        found = ", ".join(o.kinds) or "nothing"
        verdict = o.verdict + (f" ({o.detail})" if o.detail else "")
        lines.append(f"| {o.case.name} | {source} | {expected} | {found} | {verdict} | {o.fix or '-'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=os.environ.get("GRAPHWATCH_CORPUS"))
    parser.add_argument("--out", type=Path, default=HERE / "RESULTS.md")
    parser.add_argument("-k", default="", help="only the cases whose name contains this")
    args = parser.parse_args(argv)
    corpus = Path(args.corpus) if args.corpus else None
    outcomes = []
    for case in [*REAL, *repro_cases()]:
        if args.k in case.name:
            outcome = judge(case, corpus)
            found = ", ".join(outcome.kinds) or "-"
            print(f"{outcome.verdict:15} {outcome.fix or '-':13} {case.name}: {found}", flush=True)
            outcomes.append(outcome)
    if not args.k:
        args.out.write_text(table(outcomes))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
