"""Plain data: what a session recorded (capture writes it, analysis and rendering read it)."""

from .patch_check import PatchCheck
from .records import (
    GLOBALS_SCOPE,
    SAVED_KINDS,
    STEP_SOURCES,
    BackwardRecord,
    CallSite,
    DetailSpan,
    Finding,
    Holder,
    NodeRecord,
    SavedRecord,
    Snapshot,
    StepRecord,
    StepSpans,
    StepTable,
)
from .remedies import EDIT_KINDS, VALUE_TYPES, Edit, Remedy
from .source_lines import SourceLines
from .trace import Trace
from .trace_io import (
    FORMAT,
    VERSION,
    load_trace,
    save_trace,
    trace_from_dict,
    trace_to_dict,
    write_atomically,
)
from .training import OptimizerRecord, ParameterRecord

__all__ = [
    "EDIT_KINDS",
    "FORMAT",
    "GLOBALS_SCOPE",
    "SAVED_KINDS",
    "STEP_SOURCES",
    "VALUE_TYPES",
    "VERSION",
    "BackwardRecord",
    "CallSite",
    "DetailSpan",
    "Edit",
    "Finding",
    "Holder",
    "NodeRecord",
    "OptimizerRecord",
    "ParameterRecord",
    "PatchCheck",
    "Remedy",
    "SavedRecord",
    "Snapshot",
    "SourceLines",
    "StepRecord",
    "StepSpans",
    "StepTable",
    "Trace",
    "load_trace",
    "save_trace",
    "trace_from_dict",
    "trace_to_dict",
    "write_atomically",
]
