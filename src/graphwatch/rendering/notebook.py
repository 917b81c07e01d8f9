"""Summaries and findings as pieces of HTML for notebooks (Jupyter's ``_repr_html_``), in the report's look.

A session shows itself (``Session._repr_html_``); a finding is a plain record of the model, which imports
nothing above it, so its view is registered with IPython's HTML formatter here (:func:`register_displays`:
on ``import graphwatch`` inside IPython, and by ``%load_ext graphwatch``).

Example::

    >>> from graphwatch.model import Trace
    >>> from graphwatch.rendering.notebook import summary_html
    >>> 'class="graphwatch-summary"' in summary_html(Trace())
    True
"""

from __future__ import annotations

import re
import sys
from typing import Any

from ..model import Finding, Trace
from .findings_html import finding_article, finding_articles
from .html import CSS, _meta_html, _verdict_html
from .visible import html_text
from .wording import patch_lines, session_hint

NOTEBOOK_SCOPE = "graphwatch-summary"


def _scoped_css(css: str, scope: str) -> str:
    """The report's CSS with every rule limited to ``.scope`` (a notebook's own page is left alone):
    ``:root`` and ``body`` become the scope itself, everything else a descendant of it."""
    rules = []
    for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", css):
        scoped = []
        for selector in selectors.split(","):
            selector = selector.strip()
            own = selector in (":root", "body", "main")
            scoped.append(f".{scope}" if own else f".{scope} {selector}")
        rules.append(f"{','.join(scoped)}{{{body}}}")
    return "".join(rules)


def summary_html(trace: Trace, name: str = "") -> str:
    """The verdict, findings and patches of ``trace`` as a piece of HTML in the report's look (what Jupyter
    shows for a session or a finding), its styles limited to itself; with ``name``, it ends with the name the
    session is bound to in the notebook and what to call on it (:func:`named_hint`).

    >>> "graphwatch: no steps recorded" in summary_html(Trace())
    True
    >>> "gw.findings" in summary_html(Trace(), name="gw")
    True
    """
    findings = "".join(finding_articles(trace.findings, trace.sources))
    hint = f'<p class="meta">{html_text(named_hint(name))}</p>' if name else ""
    return (
        f"<style>{_scoped_css(CSS, NOTEBOOK_SCOPE)}</style>"
        f'<div class="{NOTEBOOK_SCOPE}">{_verdict_html([trace], "h1")}{_meta_html(trace, "")}{findings}{hint}</div>'
    )


def named_hint(name: str) -> str:
    """The line under a notebook's summary: the name the session is bound to, and what to call on it.

    >>> print(named_hint("gw"))  # doctest: +NORMALIZE_WHITESPACE
    this session is `gw` in the next cells: gw.summary(): the per-step table; gw.report(DIR): the HTML report;
    gw.findings: these findings
    """
    return f"this session is `{name}` in the next cells: {session_hint(name)}"


def finding_html(finding: Finding) -> str:
    """One finding as the report shows it, styled on its own (Jupyter's view of a finding)."""
    body = finding_article(finding, [])  # a finding alone holds no source lines: the trace does
    return f'<style>{_scoped_css(CSS, NOTEBOOK_SCOPE)}</style><div class="{NOTEBOOK_SCOPE}">{body}</div>'


def finding_text(finding: Finding, printer: Any, cycle: bool) -> None:
    """A finding in IPython's text view (text/plain): its text, then its patch with the patch's check state, as
    ``print(gw)`` shows them (:func:`~graphwatch.rendering.wording.patch_lines`)."""
    printer.text("\n".join([str(finding), *patch_lines(finding)]))


def register_displays(shell: Any = None) -> bool:
    """Show findings as :func:`finding_html` in ``shell`` (an IPython shell; default: the one running, if
    any), by IPython's HTML formatter, and as :func:`finding_text` by its text formatter.  True when registered;
    False when there is no shell.

    >>> register_displays()  # plain Python: no IPython shell
    False
    """
    if shell is None:
        ipython = sys.modules.get("IPython")  # never imported here: only a running IPython matters
        shell = ipython.get_ipython() if ipython is not None else None
    formatters = getattr(getattr(shell, "display_formatter", None), "formatters", None)
    if not isinstance(formatters, dict) or formatters.get("text/html") is None:
        return False
    formatters["text/html"].for_type(Finding, finding_html)
    if formatters.get("text/plain") is not None:
        formatters["text/plain"].for_type(Finding, finding_text)
    return True
