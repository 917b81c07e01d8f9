"""Analysis: pure functions from recorded steps to :class:`~graphwatch.model.Finding` s.

Example::

    >>> from graphwatch.analysis import FINDING_KINDS
    >>> FINDING_KINDS[0]
    'backward-through-freed-graph'
"""

from .detectors import FINDING_KINDS, LEAK_KINDS, step_findings
from .explain import explain_backward_twice, is_backward_twice
from .findings import FindingLog
from .growth import session_findings
from .leaks import graph_kept_alive
from .patches import add_patches

__all__ = [
    "FINDING_KINDS",
    "LEAK_KINDS",
    "FindingLog",
    "add_patches",
    "explain_backward_twice",
    "graph_kept_alive",
    "is_backward_twice",
    "session_findings",
    "step_findings",
]
