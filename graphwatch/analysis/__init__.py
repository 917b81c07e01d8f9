"""Analysis: pure functions from recorded steps to :class:`~graphwatch.model.Finding` s."""

from .detectors import FINDING_KINDS, LEAK_KINDS, FindingLog, step_findings
from .explain import explain_backward_twice, is_backward_twice
from .growth import session_findings

__all__ = [
    "FINDING_KINDS",
    "LEAK_KINDS",
    "FindingLog",
    "explain_backward_twice",
    "is_backward_twice",
    "session_findings",
    "step_findings",
]
