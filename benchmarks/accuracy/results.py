"""The accuracy table: what each case's runs gave (``Outcome``) and ``RESULTS.md``'s text (``table``).

A case judged at the default level may also carry ``full``: the diagnosis of the same bug (or clean) program run
with ``level="full"`` (every step in full detail), without fix checks.  The two levels diagnose a case the same
way when the verdict (silent, named, wrong line, missed, ...) and the finding kinds, counted, are the same::

    >>> from cases import Case
    >>> case = Case("c", None, expect=("graph-kept-alive",))
    >>> default = Outcome(case, "named", ["graph-kept-alive", "memory-growth"])
    >>> same_diagnosis(default, Outcome(case, "named", ["memory-growth", "graph-kept-alive"]))
    True
    >>> same_diagnosis(default, Outcome(case, "named", ["graph-kept-alive"]))
    False
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import date

from cases import Case


@dataclass
class Outcome:
    """What graphwatch said of one case, and how its fixes fared."""

    case: Case
    verdict: str  # "silent", "false positive", "named", "wrong line", "missed", "did not run"
    kinds: list[str]
    right: int = 0  # findings of an expected kind (or a consequence of one)
    wrong: int = 0  # findings of another kind
    twin: str = ""  # the known fix: "silent", "finding left", "fails", "" (no fix to try)
    own: str = ""  # graphwatch's fix: "trains the same", "changes training: ...", "fails: ...", "no fix ...", ...
    check: str = ""  # what --check-fixes said of that patch: "checked", "failed", "" (no patch)
    detail: str = ""
    full: Outcome | None = None  # the same program's diagnosis at level="full" (None: not run at that level)


def same_diagnosis(default: Outcome, full: Outcome) -> bool:
    """Whether both levels gave the case the same verdict and the same findings' kinds, as many of each."""
    return default.verdict == full.verdict and Counter(default.kinds) == Counter(full.kinds)


def _ratio(a: int, b: int) -> str:
    return f"{a}/{b} = {a / b:.2f}" if b else "n/a"


def _cell(text: str) -> str:
    """A table cell: a case's or a finding's text (untrusted) with its pipes escaped."""
    return text.replace("|", "\\|") or "-"


def _found(outcome: Outcome) -> str:
    return ", ".join(outcome.kinds) or "nothing"


def _measures(outcomes: list[Outcome], fixes: bool) -> list[str]:
    """The summary rows (those about fixes only where the fixes were tried)."""
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
    diagnoses = [
        f"| precision (findings of the expected kind, growth included) | {_ratio(right, total)} |",
        f"| recall (bug programs with a finding of the expected kind) | {_ratio(len(detected), len(bugs))} |",
        f"| line named (of those, the expected line cited) | {_ratio(len(named), len(detected))} |",
        f"| clean programs silent | {_ratio(sum(o.verdict == 'silent' for o in clean), len(clean))} |",
    ]
    tried = [
        f"| fixed twin silent (the known fix applied: exit 0, no finding) | "
        f"{_ratio(sum(o.twin == 'silent' for o in twins), len(twins))} |",
        f"| graphwatch's fix works (its fix applied: trains as the known fix does) | {_ratio(len(works), len(bugs))} |",
        f"| graphwatch's fix changes what trains (worse than no fix) | {_ratio(len(changes), len(bugs))} |",
        f"| a fix to apply offered (a patch, or edits) | {_ratio(len(offered), len(bugs))} |",
        f"| `--check-fixes` right (\"checked\" exactly when the fix trains the same) | "
        f"{_ratio(len(agrees), len(checked))} |",
    ]
    return [*diagnoses, *(tried if fixes else []), f"| did not run | {len(outcomes) - len(ran)} |"]


def _levels_row(outcomes: list[Outcome]) -> list[str]:
    """The summary row comparing the default level with level="full", naming the cases that differ."""
    compared = [o for o in outcomes if o.full is not None]
    if not compared:
        return []
    differ = [o.case.name for o in compared if o.full is not None and not same_diagnosis(o, o.full)]
    value = f"{len(compared) - len(differ)}/{len(compared)} cases identical"
    if differ:
        value += "; differ: " + "; ".join(differ)
    return [f"| default level finds what full finds (verdict and kinds, case by case) | {_cell(value)} |"]


def _full_cell(outcome: Outcome) -> str:
    full = outcome.full
    if full is None:
        return "-"
    verdict = full.verdict + (f" ({full.detail})" if full.detail else "")
    mark = "" if same_diagnosis(outcome, full) else " **(differs)**"
    return _cell(f"{_found(full)}: {verdict}") + mark


def table(outcomes: list[Outcome], level: str, fixes: bool = True) -> str:
    """RESULTS.md: the measures at ``level``, the levels compared where a case also ran at full, and each case
    (without ``fixes``, a table of diagnoses only: no fix was tried)."""
    both = any(o.full is not None for o in outcomes)
    lines = [
        "# Accuracy on code nobody here wrote",
        "",
        f"Regenerated {date.today().isoformat()} by `.venv/bin/python benchmarks/accuracy/run.py --corpus DIR` "
        "(real scripts from the repositories named in `cases.py`, `tutorials.py` and `more_cases.py`, at the commits "
        "named there; reproductions "
        f"in `repros/`). {level.capitalize()} level, `graphwatch run` "
        + ("(a bug with `--check-fixes`)" if fixes else "(diagnoses only: `--no-fixes`, no fix tried)")
        + ", one process per run."
        + (" The column \"found at level=full\" is the same bug (or clean) program run with `--level full`: "
           "its diagnosis only, no fix checks." if both else ""),
        "",
        "| measure | value |",
        "| --- | --- |",
        *_measures(outcomes, fixes),
        *_levels_row(outcomes),
        "",
        "How a fix is compared: both programs run seeded under `graphwatch run`; every number each prints (losses, "
        "metrics, the trained parameters' sums the reproductions print last) is compared in order, each within one "
        "unit of its last printed digit; timings (`ms/batch`, `time:`) are left out. A fix that exits 0 but prints "
        "other numbers changes what trains.",
        "",
        "| case | source | expected | found | verdict | fixed twin silent | graphwatch's fix | check |"
        + (" found at level=full |" if both else ""),
        "| --- | --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if both else ""),
    ]
    for o in outcomes:
        source = o.case.source.repo if o.case.source else "repro"
        expected = ", ".join(o.case.expect) or "silent"
        verdict = o.verdict + (f" ({o.detail})" if o.detail else "")
        row = (f"| {_cell(o.case.name)} | {source} | {expected} | {_found(o)} | {_cell(verdict)} | {o.twin or '-'} "
               f"| {_cell(o.own)} | {o.check or '-'} |")
        lines.append(row + (f" {_full_cell(o)} |" if both else ""))
    return "\n".join(lines) + "\n"
