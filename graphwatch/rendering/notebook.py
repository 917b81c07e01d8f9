"""Summaries and findings as pieces of HTML for notebooks (Jupyter's ``_repr_html_``), in the report's look.

Example::

    >>> from graphwatch.model import Trace
    >>> from graphwatch.rendering.notebook import summary_html
    >>> 'class="graphwatch-summary"' in summary_html(Trace())
    True
"""

from __future__ import annotations

import re

from ..model import Finding, Trace
from .findings_html import finding_article, finding_articles
from .html import CSS, _meta_html, _verdict_html

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


def summary_html(trace: Trace) -> str:
    """The verdict, findings and patches of ``trace`` as a piece of HTML in the report's look (what Jupyter
    shows for a session or a finding), its styles limited to itself.

    >>> "graphwatch: no steps recorded" in summary_html(Trace())
    True
    """
    findings = "".join(finding_articles(trace.findings, trace.sources))
    return (
        f"<style>{_scoped_css(CSS, NOTEBOOK_SCOPE)}</style>"
        f'<div class="{NOTEBOOK_SCOPE}">{_verdict_html([trace], "h1")}{_meta_html(trace, "")}{findings}</div>'
    )


def finding_html(finding: Finding) -> str:
    """One finding as the report shows it, styled on its own (Jupyter's view of a finding)."""
    body = finding_article(finding, [])  # a finding alone holds no source lines: the trace does
    return f'<style>{_scoped_css(CSS, NOTEBOOK_SCOPE)}</style><div class="{NOTEBOOK_SCOPE}">{body}</div>'
