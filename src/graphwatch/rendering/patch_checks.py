"""How a report shows a patch's check (``graphwatch run --check-fixes``): one line under the patch.

A check read from a trace file is what that file claims, not a verdict this process computed (a trace can
be written by anyone): it is shown as ``checked, according to the trace``.

Example::

    >>> from graphwatch.model import PatchCheck
    >>> str(check_text(PatchCheck(checked=True, steps=3, held=["the patch applies", "the finding is gone"])))
    'check: checked in 3 steps: the patch applies; the finding is gone'
    >>> "FAILED" in check_html(PatchCheck(checked=False, failed=["<x> got no gradient"]))
    True
    >>> str(check_text(PatchCheck(checked=True, steps=3, held=["the finding is gone"], from_trace=True)))
    'check: checked, according to the trace, in 3 steps: the finding is gone'
    >>> str(check_text(None))
    'check: unchecked: `graphwatch run --check-fixes` re-runs it'

A patch whose check failed is never offered as the fix to apply (:func:`failed_warning`).
"""

from __future__ import annotations

from rich.text import Text

from ..analysis.evidence import counted
from ..model import PatchCheck
from .visible import html_text, visible


def _details(check: PatchCheck) -> tuple[str, str]:
    """(the verdict word, said to be the trace's claim when it was read from one; what held or failed, and what
    the copy left out)."""
    said = "; ".join(check.held if check.checked else check.failed)
    if check.skipped:
        shown = ", ".join(check.skipped[:5]) + (f" and {len(check.skipped) - 5} more" if len(check.skipped) > 5 else "")
        said += f" (not copied: {shown})"
    claimed = ", according to the trace" if check.from_trace else ""
    if check.checked:
        return f"checked{claimed}{',' * check.from_trace}", f" in {counted(check.steps, 'step')}: {said}"
    return f"FAILED{claimed}", f": {said}"


UNCHECKED = "unchecked: `graphwatch run --check-fixes` re-runs it"  # a patch no check ran for


def failed_warning(check: PatchCheck | None) -> str | None:
    """Why a patch must not be offered as the fix to apply because of its check (it failed: the check's own
    line says what failed), or None.

    >>> failed_warning(PatchCheck(checked=False, failed=["x"])), failed_warning(None)
    ('its check failed (the check below says why): it is not the fix to apply', None)
    """
    if check is None or check.checked:
        return None
    return "its check failed (the check below says why): it is not the fix to apply"


def check_text(check: PatchCheck | None) -> Text:
    """The check as one line of the terminal summary: ``check: checked ...`` in green, ``check: FAILED ...`` in red
    (what it quotes from the run, a name or an error, with no control character left: :func:`visible`),
    ``check: unchecked ...`` when no check ran (None)."""
    if check is None:
        return Text.assemble(("check: ", "bold"), (UNCHECKED, "yellow"))
    word, said = _details(check)
    return Text.assemble(("check: ", "bold"), (word, "bold green" if check.checked else "bold red"), visible(said))


def check_html(check: PatchCheck | None) -> str:
    """The check as a paragraph of the HTML report (None: no check ran)."""
    if check is None:
        return f'<p class="check unchecked"><strong>Check:</strong> {html_text(UNCHECKED)}</p>'
    word, said = _details(check)
    verdict = "checked" if check.checked else "failed"
    return f'<p class="check {verdict}{" claimed" * check.from_trace}"><strong>Check:</strong> {word}{html_text(said)}</p>'
