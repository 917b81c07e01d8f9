"""graphwatch's own fix for a bug case, applied and compared with the known-good fix by what the program prints.

The fix is the patch of the first finding of an expected kind that has one (else of any finding); where no
finding has a patch, the first remedy that names edits, applied literally (``analysis.codemods``); where none
does either, there is nothing to apply and the table says so.  "Trains the same" means the fixed program
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
    """What graphwatch offers for a bug: a patch, or a remedy's edits applied as written (``patch`` None)."""

    finding: Finding
    patch: str | None
    how: str  # "patch" or "first fix, applied literally"


def own_fix(findings: list[Finding], expected: tuple[str, ...]) -> OwnFix | None:
    """The fix to try (see the module's docstring), or None when graphwatch offers nothing mechanical."""
    ranked = [f for f in findings if f.kind in expected] + [f for f in findings if f.kind not in expected]
    patched = next((f for f in ranked if f.patch), None)
    if patched is not None:
        return OwnFix(patched, patched.patch, "patch")
    literal = next((f for f in ranked if any(r.edits for r in f.remedies)), None)
    return OwnFix(literal, None, "first fix, applied literally") if literal is not None else None


def apply_own_fix(fix: OwnFix, folder: Path) -> str | None:
    """Apply ``fix`` to the program in ``folder`` (where it ran); None, or why it could not be applied."""
    if fix.patch is not None:
        failure = apply_patch(fix.patch, folder)
        return None if failure is None else f"the patch does not apply: {failure}"
    remedy = next(r for r in fix.finding.remedies if r.edits)
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
