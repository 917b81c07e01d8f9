"""Building findings from their evidence and remedies, and merging repeats of one problem into one finding.

Every detector puts what it knows into the finding's ``evidence`` (plain
values) and its ``remedies`` (what to do, as data: :class:`~graphwatch.model.Remedy`),
and lets a *renderer* write ``message`` from the evidence; ``fix`` is the first
remedy's sentence.  When a problem repeats (same kind, same ``key`` line, or
the same cause by a kind's own test, :func:`same_cause`), :class:`FindingLog`
merges the new evidence into the first finding (steps, per-step numbers, the
largest bytes) and renders the message again, so one finding tells the whole story.

Example::

    >>> from graphwatch.analysis.findings import FindingLog, make_finding, renderer
    >>> from graphwatch.model import Remedy
    >>> @renderer("demo-kind")
    ... def _render(ev):
    ...     return f"seen in steps {ev['steps']}"
    >>> log = FindingLog([])
    >>> log.add(make_finding("demo-kind", "warning", 1, {"key": "a.py:3", "steps": [1]}, [Remedy("fix it")]))
    True
    >>> log.add(make_finding("demo-kind", "warning", 2, {"key": "a.py:3", "steps": [2]}, [Remedy("fix it")]))
    False
    >>> [(f.step, f.message, f.fix, f.evidence["occurrences"]) for f in log.findings]
    [(1, 'seen in steps [1, 2]', 'fix it', 2)]
"""

from __future__ import annotations

from collections.abc import Callable

from ..model import Finding, Remedy

Render = Callable[[dict], str]
# (a finding kept, a new one of the same kind and another key) -> 0: another cause; 1: the same cause;
# 2: the same cause, and the new one names it better (where the first could not say what holds a graph)
SameCause = Callable[[Finding, Finding], int]
_RENDERERS: dict[str, Render] = {}
_SAME_CAUSE: dict[str, SameCause] = {}
MAX_LISTED = 50  # steps and per-step rows kept in a merged finding's evidence

_UNION = ("steps",)
_LARGEST = ("bytes", "nodes", "parameters", "items")
# Figures of one moment (a kept-alive finding's "kept": the step end, the steps it keeps, their nodes and bytes):
# the newer one replaces the older whole, so that no view mixes a range of one moment with a count of another.
_LATEST = ("kept",)


def renderer(kind: str) -> Callable[[Render], Render]:
    """Register the function that writes the message of ``kind`` from its evidence."""

    def register(render: Render) -> Render:
        _RENDERERS[kind] = render
        return render

    return register


def same_cause(kind: str) -> Callable[[SameCause], SameCause]:
    """Register the test that says two findings of ``kind`` with different keys have one cause (see
    :data:`SameCause`): the first one is kept and the other merges into it, giving it its key, its remedies
    and what its evidence knows that the first's does not, when it names the cause better."""

    def register(test: SameCause) -> SameCause:
        _SAME_CAUSE[kind] = test
        return test

    return register


def make_finding(kind: str, severity: str, step: int, evidence: dict, remedies: list[Remedy]) -> Finding:
    """A finding whose message is rendered from ``evidence``, and whose fix is its first remedy's sentence."""
    evidence.setdefault("occurrences", 1)
    fix = remedies[0].text if remedies else ""
    return Finding(kind, severity, step, _RENDERERS[kind](evidence), fix, evidence, remedies=remedies)


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
        old, better = self._index.get(key), False
        if old is None:
            old, better = self._same_cause(finding)
            if old is not None:
                self._index[key] = old  # (what comes again under this key merges there too)
        if old is None:
            self._index[key] = finding
            self.findings.append(finding)
            return True
        if better:
            self._named(old, finding)
        merge_evidence(old.evidence, finding.evidence)
        if finding.severity == "error":
            old.severity = "error"
        render = _RENDERERS.get(old.kind)
        if render is not None:
            old.message = render(old.evidence)
        return False

    def _same_cause(self, finding: Finding) -> tuple[Finding | None, bool]:
        """(the finding kept that ``finding`` has the same cause as, whether ``finding`` names it better)."""
        test = _SAME_CAUSE.get(finding.kind)
        for old in self.findings if test is not None else ():
            verdict = test(old, finding) if old.kind == finding.kind else 0  # type: ignore[misc]
            if verdict:
                return old, verdict == 2
        return None, False

    def _named(self, old: Finding, new: Finding) -> None:
        """``new`` names the cause ``old`` could not: ``old`` takes its key, its remedies and what it knows."""
        for name, value in new.evidence.items():
            if name == "key" or old.evidence.get(name) is None:
                old.evidence[name] = value
        old.evidence["sites"] = list(dict.fromkeys(new.evidence.get("sites", []) + old.evidence.get("sites", [])))
        old.remedies, old.fix = new.remedies, new.fix
        self._index[(old.kind, old.evidence.get("key"))] = old
