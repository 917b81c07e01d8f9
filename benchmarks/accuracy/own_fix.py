"""graphwatch's own fix for a bug case, applied and compared with the known-good fix by what the program prints.

The fix is what a user gets: every patch of the run together, as ``graphwatch run --patch-out FILE`` wrote
them (a patch whose check failed is left out there, as are patches that overlap an earlier one); where no
finding has a patch, the first remedy that names edits (of a finding of an expected kind first), applied
literally (``analysis.codemods``); where none does either, or every patch failed its check, there is nothing
to apply and the table says so.  "Trains the same" means the fixed program
exits 0 and prints the same numbers as the known-good program (its losses and metrics; seeded runs), each
within one unit of its last printed digit; numbers that are timings (``ms/batch 12.3``, ``time: 4.1s``) are
left out.  A fix that silences the error but prints other numbers changes what trains: worse than no fix.

Example::

    >>> printed_numbers("| epoch 1 | ms/batch 12.30 | loss 5.25 | ppl 190.5")
    ['1', '5.25', '190.5']
    >>> different(["5.25", "190.5"], ["5.26", "190.5"]), different(["5.25"], ["5.30"]), different(["40"], ["41"])
    (None, 'prints 5.25 where the known fix prints 5.30', 'prints 40 where the known fix prints 41')
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from graphwatch.analysis.codemods import apply_edits
from graphwatch.fix_checks import apply_patch
from graphwatch.model import Finding

_TIMING = re.compile(r"(ms/batch|s/it|it/s|time|elapsed|took)\s*:?\s*[-+]?\d+(\.\d+)?\s*(ms|s)?\b", re.IGNORECASE)
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?(?![\w.])")


@dataclass
class OwnFix:
    """What graphwatch offers for a bug: the run's patches, or a remedy's edits applied as written (``patch`` None)."""

    findings: list[Finding]  # the findings it fixes: those whose patches went in, or the one whose edits are applied
    patch: str | None  # the file --patch-out wrote
    how: str  # "patch", "N patches together" or "first fix, applied literally"

    @property
    def check(self) -> str:
        """What ``--check-fixes`` said of the patches applied: "checked" when each was checked, "failed" when
        a check failed, "" when none ran (or the fix is no patch)."""
        checks = [f.check for f in self.findings if f.patch and f.check is not None]
        return "" if not checks else ("checked" if all(c.checked for c in checks) else "failed")


def own_fix(findings: list[Finding], expected: tuple[str, ...], patches: str) -> OwnFix | str:
    """The fix to try (see the module's docstring; ``patches``: what ``--patch-out`` wrote), or why there is none."""
    applied = list({f.patch: f for f in findings if f.patch and (f.check is None or f.check.checked)}.values())
    if any(line.startswith("--- ") for line in patches.splitlines()) and applied:
        how = "patch" if len(applied) == 1 else f"{len(applied)} patches together"
        return OwnFix(applied, patches, how)
    if any(f.patch for f in findings):
        return "no fix: every patch failed its check (--patch-out leaves them out)"
    ranked = [f for f in findings if f.kind in expected] + [f for f in findings if f.kind not in expected]
    literal = next((f for f in ranked if any(r.edits for r in f.remedies)), None)
    if literal is None:
        return "no fix: its fixes are sentences, with no patch or edits to apply"
    return OwnFix([literal], None, "first fix, applied literally")


def apply_own_fix(fix: OwnFix, folder: Path) -> str | None:
    """Apply ``fix`` to the program in ``folder`` (where it ran); None, or why it could not be applied."""
    if fix.patch is not None:
        failure = apply_patch(fix.patch, folder)
        return None if failure is None else f"the patches do not apply: {failure}"
    remedy = next(r for r in fix.findings[0].remedies if r.edits)
    for file in dict.fromkeys(edit.file for edit in remedy.edits):
        path = folder / file
        if not path.is_file():
            return f"the fix edits {file}, not a file of the program"
        edited = apply_edits(path.read_text(), [e for e in remedy.edits if e.file == file])
        if edited is None:
            return f"the first fix cannot be applied as written at {remedy.edits[0].where}"
        path.write_text(edited)
    return None


def printed_numbers(text: str) -> list[str]:
    """The numbers a program printed, timings left out."""
    return _NUMBER.findall(_TIMING.sub(" ", text))


def different(numbers: list[str], known: list[str]) -> str | None:
    """None when both print the same numbers (within one unit of the last printed digit), else the first difference."""
    if len(numbers) != len(known):
        return f"prints {len(numbers)} numbers where the known fix prints {len(known)}"
    for mine, theirs in zip(numbers, known):
        tolerance = max(_unit(mine), _unit(theirs)) * 1.0001
        if abs(float(mine) - float(theirs)) > tolerance:
            return f"prints {mine} where the known fix prints {theirs}"
    return None


def _unit(number: str) -> float:
    """One unit of the last printed digit (0 for a whole number: printed exactly)."""
    mantissa, _, exponent = number.lower().partition("e")
    if "." not in mantissa:
        return 0.0
    return 10.0 ** (int(exponent or 0) - len(mantissa.partition(".")[2]))
