"""Building findings from their evidence, and merging repeats of one problem into one finding.

Every detector puts what it knows into the finding's ``evidence`` (plain
values) and lets a *renderer* write ``message`` and ``fix`` from it.  When a
problem repeats (same kind, same ``key`` line), :class:`FindingLog` merges the
new evidence into the first finding (steps, per-step numbers, the largest
bytes) and renders the text again, so one finding tells the whole story.

Example::

    >>> from graphwatch.analysis.findings import FindingLog, make_finding, renderer
    >>> @renderer("demo-kind")
    ... def _render(ev):
    ...     return f"seen in steps {ev['steps']}", "fix it"
    >>> log = FindingLog([])
    >>> log.add(make_finding("demo-kind", "warning", 1, {"key": "a.py:3", "steps": [1]}))
    True
    >>> log.add(make_finding("demo-kind", "warning", 2, {"key": "a.py:3", "steps": [2]}))
    False
    >>> [(f.step, f.message, f.evidence["occurrences"]) for f in log.findings]
    [(1, 'seen in steps [1, 2]', 2)]
"""

from __future__ import annotations

from collections.abc import Callable

from ..model import Finding

Render = Callable[[dict], "tuple[str, str]"]
_RENDERERS: dict[str, Render] = {}
MAX_LISTED = 50  # steps and per-step rows kept in a merged finding's evidence

_UNION = ("steps",)
_LARGEST = ("bytes", "nodes", "parameters", "items")
# Figures of one moment (a kept-alive finding's "kept": the step end, the steps it keeps, their nodes and bytes):
# the newer one replaces the older whole, so that no view mixes a range of one moment with a count of another.
_LATEST = ("kept",)


def renderer(kind: str) -> Callable[[Render], Render]:
    """Register the function that writes (message, fix) of ``kind`` from its evidence."""

    def register(render: Render) -> Render:
        _RENDERERS[kind] = render
        return render

    return register


def make_finding(kind: str, severity: str, step: int, evidence: dict) -> Finding:
    """A finding whose message and fix are rendered from ``evidence``."""
    evidence.setdefault("occurrences", 1)
    message, fix = _RENDERERS[kind](evidence)
    return Finding(kind, severity, step, message, fix, evidence)


def _capped(values: list) -> list:
    return values if len(values) <= MAX_LISTED else values[:1] + values[-(MAX_LISTED - 1) :]


def merge_evidence(old: dict, new: dict) -> None:
    """Fold ``new`` into ``old``: union the steps, append per-step rows, keep the largest sizes and the
    newer moment's figures."""
    for name, value in new.items():
        if name in _UNION:
            old[name] = _capped(sorted(set(old.get(name, [])) | set(value)))
        elif name == "per_step":
            old[name] = _capped(old.get(name, []) + value)
        elif name == "sites":
            old[name] = list(dict.fromkeys(old.get(name, []) + value))
        elif name in _LATEST:
            old[name] = value
        elif name in _LARGEST and isinstance(value, (int, float)):
            old[name] = max(old.get(name) or 0, value)
        elif name == "occurrences":
            continue
        else:
            old.setdefault(name, value)
    old["occurrences"] = old.get("occurrences", 1) + 1


class FindingLog:
    """Findings of a session, one per (kind, key line), in the order first seen."""

    def __init__(self, findings: list[Finding]) -> None:
        self.findings = findings
        self._index = {(f.kind, f.evidence.get("key")): f for f in findings}

    def logged(self, finding: Finding) -> Finding:
        """The finding of the log that ``finding`` was added as or merged into."""
        return self._index[(finding.kind, finding.evidence.get("key"))]

    def add(self, finding: Finding) -> bool:
        """Add ``finding``; True if it is new, False if it merged into an earlier one."""
        key = (finding.kind, finding.evidence.get("key"))
        old = self._index.get(key)
        if old is None:
            self._index[key] = finding
            self.findings.append(finding)
            return True
        merge_evidence(old.evidence, finding.evidence)
        if finding.severity == "error":
            old.severity = "error"
        render = _RENDERERS.get(old.kind)
        if render is not None:
            old.message, old.fix = render(old.evidence)
        return False
