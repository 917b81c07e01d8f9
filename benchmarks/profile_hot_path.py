"""cProfile of graphwatch's hot path: the MLP loop of DESIGN.md fact 9 under ``graphwatch.watch()`` defaults.

    PYTHONPATH=src python benchmarks/profile_hot_path.py [--steps 2000] [--workload mlp] [--level light]

Prints the unprofiled cost (bare vs session, CPU time, interleaved), the top
functions by own time (tottime), graphwatch's functions only, and a per-step
attribution: time in graphwatch's pack hook, call-site lookup, graph walk,
finalizers, optimizer hooks, step end and analysis, as CPU ms/step and as a
share of the profiled step.  cProfile inflates Python-heavy code more than
C++ ops, so read the shares as "what costs what", and the ratios of
``run.py`` as the overhead.  ``run.py`` includes the attribution table in
RESULTS.md through :func:`profile`.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import workloads as W

import graphwatch

warnings.filterwarnings("ignore")

# (label, file suffix or suffixes, function name or names): the cumulative time of each, per step
PHASES = [
    ("pack hook (saved.py make_hooks.pack), all of it", "capture/hooks/saved.py", "pack"),
    ("  _new_handle: handle, kind, storage key", "capture/hooks/saved.py", "_new_handle"),
    ("  Recorder.pack_site (once per op)", "capture/recorder.py", "pack_site"),
    ("    call-site lookup (callsite.py SiteTable._walk)", "capture/lines/callsite.py", "_walk"),
    ("  Recorder.saved_packed (live-bytes accounting)", "capture/recorder.py", "saved_packed"),
    ("unpack hook (saved.py make_hooks.unpack)", "capture/hooks/saved.py", "unpack"),
    ("saved-handle finalizer (SavedHandle.__del__)", "capture/hooks/saved.py", "__del__"),
    ("engine wrapper (Session._on_engine), incl. walk and the backward itself", "session.py", "_on_engine"),
    ("graph walk before backward (BackwardWatch.walk_before)", "backwards.py", "walk_before"),
    ("  graph_walk.quick_walk: tags only (a graph made this step, freed by its backward)", "capture/graph/graph_walk.py",
     "quick_walk"),
    ("  graph_walk.walk: the full walk (first backward, retained or crossing graphs)", "capture/graph/graph_walk.py", "walk"),
    ("    graph_walk._record: NodeRecord and its saved records", "capture/graph/graph_walk.py", "_record"),
    ("node-tag finalizer (NodeTag.__del__)", "capture/graph/graph_walk.py", "__del__"),
    ("optimizer pre hook (Session._before_optimizer)", "session.py", "_before_optimizer"),
    ("optimizer post hook (Session._after_optimizer)", "session.py", "_after_optimizer"),
    ("  GradResetTracker.before_step + after_step", "capture/hooks/optimizer.py", ("before_step", "after_step")),
    ("  does the step end here? (LoopSteps.ends_step, also called per backward)", "capture/steps/loop_steps.py", "ends_step"),
    ("  step end (Session._end_step)", "session.py", "_end_step"),
    ("    holder search (HolderSearch.at_step_end; census: steps 0,1,2,4,..)", "capture/causes/holders.py", "at_step_end"),
    ("    Recorder.end_step", "capture/recorder.py", "end_step"),
    ("      Recorder._snapshot_live (incl. the RSS read)", "capture/recorder.py", "_snapshot_live"),
    ("      Recorder._keep_outliving (records of saved tensors alive at step end)", "capture/recorder.py", "_keep_outliving"),
    ("      RecordList.freeze (settled steps into columns)", "model/columns.py", "freeze"),
    ("    analysis: step_findings", "analysis/detectors.py", "step_findings"),
    ("      Trace.where / CallSite.where (call-site strings)", ("model/trace.py", "model/records.py"), "where"),
    ("snapshot (BackwardWatch.snapshot)", "backwards.py", "snapshot"),
]


def profile(workload_name: str = "mlp", steps: int = 2000, level: str = "default", top: int = 30) -> dict[str, Any]:
    """Unprofiled bare/session CPU ms per step, then a cProfile of ``steps`` steps under the session."""
    torch.set_num_threads(1)
    workload = W.all_workloads()[workload_name]()
    step = workload.step
    for _ in range(20):
        step()

    def timed(factory: Any, n: int) -> float:
        with factory():
            started = time.process_time()
            for _ in range(n):
                step()
            return 1e3 * (time.process_time() - started) / n

    n = max(20, steps // 10)
    bare, watched = [], []
    for _ in range(5):  # interleaved
        bare.append(timed(contextlib.nullcontext, n))
        watched.append(timed(lambda: graphwatch.watch(summary=False, level=level), n))

    profiler = cProfile.Profile(time.process_time)
    with graphwatch.watch(summary=False, level=level):
        profiler.enable()
        started = time.process_time()
        for _ in range(steps):
            step()
        elapsed = time.process_time() - started
        profiler.disable()

    stats = pstats.Stats(profiler)
    table = stats.stats  # type: ignore[attr-defined]
    per_step = 1e3 * elapsed / steps
    rows = []
    for label, suffix, names in PHASES:
        names = (names,) if isinstance(names, str) else names
        cum = calls = 0.0
        for (filename, _, func), (_cc, nc, _tt, ct, _callers) in table.items():
            if func in names and filename.replace("\\", "/").endswith(suffix):
                cum += ct
                calls += nc
        if calls:
            ms = 1e3 * cum / steps
            rows.append((label, ms, 100 * ms / per_step, calls / steps))
    own = []
    package = str(Path(graphwatch.__file__).resolve().parent) + "/"
    for (filename, line, func), (_cc, nc, tt, ct, _callers) in table.items():
        if filename.startswith(package):
            own.append(
                (
                    1e3 * tt / steps,
                    1e3 * ct / steps,
                    nc / steps,
                    f"{filename[len(package) :]}:{line}({func})",
                )
            )
    own.sort(reverse=True)
    text = io.StringIO()
    stats.stream = text  # type: ignore[attr-defined]
    stats.sort_stats("tottime").print_stats(top)
    return {
        "workload": workload,
        "level": level,
        "steps": steps,
        "bare_ms": statistics.median(bare),
        "session_ms": statistics.median(watched),
        "profiled_ms": per_step,
        "phases": rows,
        "own": own,
        "top_text": text.getvalue(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument(
        "--workload",
        default="mlp",
        help="mlp, cnn, lstm, lstmcell, transformer, rnn10k",
    )
    parser.add_argument("--level", default="default", choices=["default", "light"])
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    result = profile(args.workload, args.steps, args.level, args.top)
    w = result["workload"]
    print(f"{w.name} ({w.description})")
    print(
        f"unprofiled, CPU time, medians of 5 interleaved runs: bare {result['bare_ms']:.3f} ms/step, graphwatch "
        f"level={args.level} {result['session_ms']:.3f} ms/step ({result['session_ms'] / result['bare_ms']:.2f}x)"
    )
    print(f"profiled: {args.steps} steps, {result['profiled_ms']:.3f} CPU ms/step under cProfile\n")
    print(f"== top {args.top} functions by tottime (all code) ==")
    print(result["top_text"])
    print(f"== graphwatch functions by own time (top {args.top}), CPU ms per step under cProfile ==")
    print(f"  {'own':>8} {'cum':>8} {'calls':>7}  function")
    for tt, ct, calls, name in result["own"][: args.top]:
        print(f"  {tt:8.4f} {ct:8.4f} {calls:7.1f}  {name}")
    print("\n== per-step attribution (cumulative time of each function), CPU ms per step under cProfile ==")
    for label, ms, share, calls in result["phases"]:
        print(f"  {label:<74} {ms:8.4f} ms/step {share:5.1f}%  {calls:7.1f} calls/step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
