"""Small helpers the detectors share: naming a site, its variable, and sizes.

Example::

    >>> from graphwatch.analysis.evidence import assigned_name, human_bytes
    >>> assigned_name("h, c = cell(x, (h, c))"), assigned_name("total_loss += loss")
    ('h', 'total_loss')
    >>> human_bytes(3 * 1024 * 1024)
    '3.0 MiB'
"""

from __future__ import annotations

import re

from ..model import CallSite, Trace

_TARGET = re.compile(r"^\s*([A-Za-z_][\w.]*(?:\[[^\]]*\])?)\s*(?:,[^=]*)?(?:[-+*/@]?=)(?!=)")


def assigned_name(source: str) -> str | None:
    """The first variable a line of source assigns to, if it is an assignment."""
    match = _TARGET.match(source)
    return match.group(1) if match else None


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def describe_site(trace: Trace, site_id: int | None) -> str:
    """'train.py:18 (`h = cell(x, h)`)' or '<unknown line>'."""
    site = trace.site(site_id)
    if site is None:
        return "<unknown line>"
    return f"{site.where} (`{site.source}`)" if site.source else site.where


def site_chain(trace: Trace, site_id: int | None) -> list[CallSite]:
    """The site and the user frames that called it, innermost first."""
    chain = []
    while site_id is not None:
        site = trace.sites[site_id]
        chain.append(site)
        site_id = site.caller
    return chain


def outermost_assignment(trace: Trace, site_id: int | None) -> tuple[CallSite | None, str | None]:
    """The innermost site in the chain that assigns a variable, and that variable.

    For ``h = cell(x, h)`` calling a user module's ``return torch.tanh(...)``,
    the call line names the carried tensor better than the line inside.
    """
    for site in site_chain(trace, site_id):
        name = assigned_name(site.source)
        if name is not None:
            return site, name
    return trace.site(site_id), None
