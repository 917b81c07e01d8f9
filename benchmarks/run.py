"""graphwatch overhead benchmark: one command, one process, interleaved configurations.

    PYTHONPATH=src python benchmarks/run.py           # full run, writes benchmarks/RESULTS.md
    PYTHONPATH=src python benchmarks/run.py --quick   # a few minutes

Per workload (``workloads.py``) every round runs each configuration
(``configs.py``) for the same number of training steps, one context (session,
profiler, anomaly mode) spanning the round's steps as in real use; the order
of the configurations rotates from round to round (``measure.py``).
Reported: the median over rounds of ms/step, and the median over rounds of
the *paired* ratio (configuration / bare of the same round).  Also: cost per
step of 10k vs 100k-node graphs under a low recursion limit
(``deep_graph.py``); a long run of a tiny loop for graphwatch's own memory
and trace size (``longrun.py``); a cProfile attribution of the MLP loop
(``profile_hot_path.py``); a step-per-backward script's whole process,
``python`` against ``graphwatch run`` (``whole_process.py``); with
``--instructions``, instructions per step counted by callgrind
(``instructions.py``).  RESULTS.md is
written by ``results.py``; the goals it checks are in ``targets.py``.
Benchmarks are not part of the test suite.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
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
from adaptive import KEPT_STEPS, KEPT_WINDOW, measure_kept, measure_steady, measure_whole
from configs import CONFIGS
from instructions import DEFAULT_CONFIGS, DEFAULT_WORKLOADS, InstructionResult, measure_instructions, unavailable
from longrun import long_run
from measure import Log, Shape, WorkloadResult, fmt_x, measure
from results import machine, write_results
from whole_process import measure_process

warnings.filterwarnings("ignore")  # detect_anomaly warns on every entry; numpy-less torch warns once


def parse_args(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--quick", action="store_true", help="fewer rounds and steps, a 5,000-step long run (a few minutes)")
    add("--only", default="", help="comma-separated workloads (" + ",".join(W.all_workloads()) + ")")
    add("--configs", default=",".join(CONFIGS), help="comma-separated configurations")
    add("--rounds", type=int, default=0, help="override the rounds of every workload")
    add("--long-steps", type=int, default=None, help="steps of the long run (default 100000; --quick 5000; 0 skips it)")
    add("--long-budget", type=float, default=600.0, help="stop the long run after this many seconds")
    add(
        "--profile-steps",
        type=int,
        default=None,
        help="steps of the cProfile'd MLP loop for RESULTS.md (default 1000; --quick 300; 0 skips it)",
    )
    add("--headroom", type=int, default=120, help="recursion limit on deep graphs = current depth + this")
    add("--steady-rounds", type=int, default=None, help="rounds of the steady-state sessions (0 skips them)")
    add(
        "--process-rounds",
        type=int,
        default=None,
        help=f"rounds of the whole-process runs of a {W.SGD_STEPS}-step script (default 9; --quick 3; 0 skips them)",
    )
    add("--kept-steps", type=int, default=None, help=f"steps of the kept-graphs run (default {KEPT_STEPS:,}; 0 skips it)")
    add(
        "--instructions",
        nargs="?",
        const=",".join(DEFAULT_WORKLOADS),
        default="",
        metavar="WORKLOADS",
        help="also count instructions per step under callgrind (instructions.py; default workloads "
        f"{','.join(DEFAULT_WORKLOADS)}: about 13 min; lstmcell about 2.5 hours)",
    )
    add("--out", default=str(HERE / "RESULTS.md"), help="where to write the results")
    return parser, parser.parse_args(argv)


def plan(args: argparse.Namespace, only: set[str]) -> list[list[Shape]]:
    """The groups of workloads to measure (a group is measured together, interleaved), with steps and rounds."""
    groups: dict[str, list[Shape]] = {}
    for name, make in W.all_workloads().items():
        if only and name not in only:
            continue
        workload = make()
        steps, rounds = workload.steps_per_round, workload.rounds
        if args.quick:
            steps, rounds = max(2 if workload.deep else 1, steps // 2), max(2 if workload.deep else 3, rounds // 4)
        groups.setdefault(workload.group or name, []).append((workload, steps, args.rounds or rounds))
    return list(groups.values())


def main(argv: list[str] | None = None) -> int:
    parser, args = parse_args(argv)
    configs = [c for c in args.configs.split(",") if c]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown configurations {unknown}; choose from {list(CONFIGS)}")
    if "bare" not in configs:
        configs.insert(0, "bare")
    only = {w for w in args.only.split(",") if w}
    counted = [w for w in args.instructions.split(",") if w]
    unknown = sorted((only | set(counted)) - set(W.all_workloads()))
    if unknown:
        parser.error(f"unknown workloads {unknown}; choose from {list(W.all_workloads())}")
    faulthandler.enable()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    wall = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - wall:7.1f}s] {msg}", flush=True)

    info = machine()
    for k, v in info.items():
        log(f"{k}: {v}")
    results: dict[str, WorkloadResult] = {}
    for group in plan(args, only):
        for workload, steps, rounds in group:
            log(f"{workload.name}: {workload.description}; {workload.nodes:,} nodes; {steps} steps x {rounds} rounds")
        if len(group) > 1:
            log(f"  measured together, interleaved: {', '.join(w.name for w, _, _ in group)}")
        for name, r in measure(group, configs, args.headroom, log).items():
            results[name] = r
            ratios = ", ".join(f"{c} {fmt_x(r.ratio(c))}" for c in r.configs if c != "bare")
            log(f"  {name} done in {r.seconds:.0f} s: {ratios}")
        del group
        gc.collect()
    steady = whole = None
    if args.steady_rounds != 0:
        steady = measure_steady(only, configs, args.steady_rounds or 0, args.quick, args.headroom, log)
        whole = measure_whole(only, args.steady_rounds or 0, args.quick, args.headroom, log)
        gc.collect()
    process_rounds = args.process_rounds if args.process_rounds is not None else (3 if args.quick else 9)
    process = None
    if process_rounds > 0:
        log(f"whole processes: {W.SGD_STEPS} steps of manual SGD, python / graphwatch run, {process_rounds} rounds")
        process = measure_process(process_rounds, W.SGD_STEPS, log)
    kept_steps = args.kept_steps if args.kept_steps is not None else (3000 if args.quick else KEPT_STEPS)
    kept = measure_kept(kept_steps, min(KEPT_WINDOW, kept_steps // 10), log) if kept_steps > 0 else None
    long = None
    long_steps = args.long_steps if args.long_steps is not None else (5000 if args.quick else 100_000)
    if long_steps > 0:
        log(f"long run: {long_steps:,} steps of a tiny loop")
        config = "gw" if not any("gw" in r.errors for r in results.values()) else "gw_nosnap"
        long = long_run(long_steps, config, args.long_budget, log)
    instructions = _instructions(counted, configs, log) if counted else None
    profile_steps = args.profile_steps if args.profile_steps is not None else (300 if args.quick else 1000)
    prof = _profile(profile_steps, log) if profile_steps > 0 else None
    text = write_results(
        Path(args.out),
        info,
        results,
        long,
        prof,
        quick=args.quick,
        wall=time.perf_counter() - wall,
        headroom=args.headroom,
        steady=steady,
        whole=whole,
        kept=kept,
        process=process,
        instructions=instructions,
    )
    print()
    print(text)
    log(f"wrote {args.out}")
    return 0


def _instructions(workloads: list[str], configs: list[str], log: Log) -> dict[str, InstructionResult] | None:
    """Instructions per step of the listed workloads, for the configurations of this run that it counts."""
    why = unavailable()
    if why:
        log(f"instructions: skipped, {why}")
        return None
    counted = [c for c in DEFAULT_CONFIGS if c in configs]
    return measure_instructions(workloads, counted, 2, log)


def _profile(steps: int, log: Log) -> dict[str, Any] | None:
    log(f"profiling the MLP loop under graphwatch defaults ({steps:,} steps)")
    import profile_hot_path

    try:
        return profile_hot_path.profile("mlp", steps, "default")
    except Exception as exc:
        log(f"  ! profile failed: {type(exc).__name__}: {exc}")
        return None


if __name__ == "__main__":
    sys.exit(main())
