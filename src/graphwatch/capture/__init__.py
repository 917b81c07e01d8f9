"""Capture: hooks, engine patch and step boundaries that record into a Trace.

Nothing here holds an autograd node or tensor beyond what autograd itself holds.
"""

from .causes.carriers import frontier
from .graph.graph_walk import node_record, path_to, quick_walk, root_records, walk
from .graph.node_types import saved_handles
from .hooks.backward import EnginePatch, parse_engine_args
from .recorder import Recorder

__all__ = [
    "EnginePatch", "Recorder", "frontier", "node_record", "parse_engine_args", "path_to", "quick_walk", "root_records",
    "saved_handles", "walk",
]  # fmt: skip
