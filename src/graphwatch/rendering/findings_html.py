"""A finding in the HTML report: kind, steps, message, fix, its patch with a copy button, the source lines it cites.

Example::

    >>> from graphwatch.model import Finding
    >>> html = finding_article(Finding("retained-graph", "warning", 3, "the `x` line", "drop it"), sources=[])
    >>> "<code>x</code>" in html and '<p class="fix"><strong>Fix:</strong> drop it</p>' in html
    True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..model import Finding, PatchCheck, SourceLines
from .gallery import code_spans
from .patch_checks import check_html
from .patch_file import not_for_copying
from .sources import SourceExcerpt, cited_excerpts
from .visible import html_attr, html_text
from .wording import finding_steps, steps_text


def _excerpt_html(excerpt: SourceExcerpt) -> str:
    rows = "".join(
        f'<span class="{"cited" if number in excerpt.cited else "ctx"}"><span class="ln">{number}</span>'
        f"{html_text(text) or ' '}</span>"
        for number, text in excerpt.numbered()
    )
    return f'<figure class="source"><figcaption>{html_attr(excerpt.where)}</figcaption><pre>{rows}</pre></figure>'


def _diff_class(line: str) -> str:
    if line.startswith(("+++", "---", "@@")):
        return "hunk"
    return {"+": "add", "-": "del"}.get(line[:1], "")


def _patch_html(patch: str, cwd: str | None, check: PatchCheck | None = None) -> str:
    """The finding's patch as a diff with a copy button (the page's one script copies the text).

    A patch holding characters that hide or reorder what it shows (bidirectional controls, ESC, ...), or one
    that writes outside the run's folder ``cwd``, or whose ``check`` failed
    (:func:`~graphwatch.rendering.patch_file.not_for_copying`),
    is shown as text (hidden characters made visible) under a warning, and has no copy button.

    >>> 'class="copy"' in _patch_html("+x = 1 #\u202e", None), 'class="copy"' in _patch_html("--- /etc/passwd", None)
    (False, False)
    """
    lines = "".join(f'<span class="{_diff_class(line)}">{html_text(line)}</span>\n' for line in patch.splitlines())
    warning = not_for_copying(patch, cwd, check)
    if warning is not None:
        head = f'<p class="patch-warning">{html_attr(warning[0].upper() + warning[1:])}; it is shown as text, any ' \
            "hidden character marked, and it is not offered for copying.</p>"
        title = "<strong>Patch, not to apply as it is</strong>"
    else:
        head = '<button type="button" class="copy">copy</button>'
        title = "<strong>Patch</strong> (apply with <code>patch -p0</code>)"
    return f'<div class="patch"><div class="patch-head">{title}{head}</div><pre>{lines}</pre></div>'


def _same_patch_html(kind: str) -> str:
    return f'<p class="patch-same"><strong>Patch:</strong> the one under <code>{html_attr(kind)}</code> above</p>'


def finding_articles(findings: Sequence[Finding], sources: Sequence[SourceLines], notes: Mapping[int, str] | None = None,
                     cwd: str | None = None) -> list[str]:
    """Each finding's HTML, its cited lines from ``sources`` (the trace's; ``notes``: by ``id(finding)``, e.g.
    "only on rank 1"); a patch two findings share (an error and the carried graph behind it) is shown under the
    first only.  ``cwd``: the folder the run ran in (a patch that writes outside it is not offered for copying).

    >>> f = Finding("retained-graph", "warning", 3, "m", "f", patch="--- a.py\\n+++ a.py\\n")
    >>> [part.count('class="copy"') for part in finding_articles([f, f], sources=[])]
    [1, 0]
    """
    shown: dict[str, str] = {}
    parts = []
    for finding in findings:
        note = (notes or {}).get(id(finding), "")
        parts.append(finding_article(finding, sources, note, shown.get(finding.patch or "", ""), cwd))
        if finding.patch:
            shown.setdefault(finding.patch, finding.kind)
    return parts


def finding_article(
    finding: Finding, sources: Sequence[SourceLines], note: str = "", patch_above: str = "", cwd: str | None = None
) -> str:
    """One finding: kind, steps, message, fix, its patch (or, ``patch_above``, the kind of the finding above
    that shows the same one; ``cwd``: as :func:`finding_articles`), the source lines it cites (from ``sources``,
    the trace's stored lines)."""
    excerpts = cited_excerpts(finding, sources)
    shown = {site for e in excerpts for site in e.sites}
    unread = [s for s in dict.fromkeys(finding.evidence.get("sites") or []) if s not in shown and s != "<unknown>"]
    missing = (
        f'<p class="unread">also cited (source not in the trace): {html_attr(", ".join(map(str, unread)))}</p>' if unread else ""
    )
    severity = html_attr(finding.severity)
    return (
        f'<article class="finding {severity}"><header><span class="badge">{severity}</span>'
        f'<code class="kind">{html_attr(finding.kind)}</code>'
        + (f'<span class="ranks">{html_attr(note)}</span>' if note else "")  # "only on rank 1"
        + f'<span class="steps">{html_attr(steps_text(finding_steps(finding)))}</span></header>'
        f'<p class="message">{code_spans(finding.message)}</p>'
        + (f'<p class="fix"><strong>Fix:</strong> {code_spans(finding.fix)}</p>' if finding.fix not in finding.message else "")
        + (_same_patch_html(patch_above) if finding.patch and patch_above else "")
        + (_patch_html(finding.patch, cwd, finding.check) if finding.patch and not patch_above else "")
        + (check_html(finding.check) if finding.patch and not patch_above else "")
        + "".join(map(_excerpt_html, excerpts))
        + missing
        + "</article>"
    )
