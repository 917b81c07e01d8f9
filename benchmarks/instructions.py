"""Instructions per step, counted by valgrind's callgrind: the steady-state and whole-run ratios without the noise.

On a shared 2-core machine the CPU-time ratios of ``run.py`` move by several percent from run to run, more than
issue 42's margins (the default level's steady state at most 1.10x bare, the light level within 0.02 of its
floor). The instructions a step executes do not move: a run of the same program counts the same instructions (in
the same memory layout: another environment or path moves them by a few tenths of a percent). Their ratios sit
below the time ratios, by a factor that depends on the workload: bare's step runs its instructions faster than
graphwatch's Python runs its own, most of all where torch's kernels do the work (steps 10-199, light level: manual
SGD 1.21x in instructions, 1.30x in time; the MLP 1.04x, 1.13x). So the counts compare commits and configurations
of one workload, exactly; they do not judge a goal stated in time.

Each (workload, configuration) is one fresh process under ``valgrind --tool=callgrind``, with one thread
(``OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1``, ``torch.set_num_threads(1)``: OpenBLAS's idle thread spins, and
valgrind runs threads one at a time) and a fixed ``PYTHONHASHSEED``. It runs what ``measure.measure`` runs: a
2-step warm-up session, then a session of :data:`adaptive.STEADY_STEPS` steps and, for
:data:`adaptive.WHOLE_WORKLOADS` and :data:`adaptive.WHOLE_CONFIGS`, a session of :data:`adaptive.WHOLE_STEPS`
steps, each after ``begin`` and a full collection; no clock is read around the steps and no session method is
wrapped. The phases are cut by callgrind itself: the child calls ``os.sched_yield()`` at each boundary and
nowhere else, and ``--dump-before=os_sched_yield`` (the C function behind it in CPython 3.11, called by nothing
else here) writes the instructions counted since the last boundary to a part of its own
(``callgrind.out.NAME.N``), whose ``summary:`` line is read back. The parent checks that the child dumped as many
parts as it has boundaries. Parts: entering the session, steps 0 to :data:`adaptive.STEADY_FROM` - 1, the steady
steps after them, leaving it; the whole run (entering, its steps and leaving) in one part.

Starting Python and ``import torch`` take about 80 s under callgrind, so the child runs uninstrumented
(``--instr-atstart=no``: valgrind's own slowdown only, about 20 s) up to a line it prints once its workload is
built and warmed up; the parent then switches instrumentation on (``callgrind_control -i on PID``, through vgdb)
and tells the child to go on. That changes no instruction the child runs (the counts moved as another layout moves
them), only the time they take. Two processes run at a time (``--jobs``).

    PYTHONPATH=src python benchmarks/instructions.py --out /tmp/i.md   # mlp and manualsgd, six configurations (~13 min)
    PYTHONPATH=src python benchmarks/instructions.py --only lstmcell   # ~60M instructions a step: about 2.5 hours
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import IO, NoReturn

import torch
import workloads as W
from adaptive import DEEP_STEADY_STEPS, STEADY_FROM, STEADY_STEPS, WHOLE_CONFIGS, WHOLE_STEPS, WHOLE_WORKLOADS
from configs import CONFIGS, context
from targets import LIGHT_MARGIN, STEADY_GOAL, WHOLE_GOAL

DEFAULT_WORKLOADS = ("mlp", "manualsgd")  # LSTMCell's steps are 20 times the MLP's: hours under callgrind
DEFAULT_CONFIGS = ("bare", "gw", "gw_full", "light", "floor", "light_floor")
MARK = "os_sched_yield"  # the C function of os.sched_yield(): each call ends a part
READY = "instructions: ready"  # what the child prints before the measured part
WARMUP_STEPS = 2  # as measure.measure's warm-up round
# the parts the child dumps, in order (None: between two measured ones, not reported)
STEADY_PARTS = (None, "enter", "first", "steady", "exit")
WHOLE_PARTS = (None, "whole")
Log = Callable[[str], None]


def steady_steps(workload: str) -> int:
    """The steps of the workload's steady-state session (as ``adaptive.steady_groups``)."""
    return DEEP_STEADY_STEPS.get(workload, STEADY_STEPS)


def has_whole(workload: str, config: str) -> bool:
    """Whether the child also runs a whole run (``adaptive.measure_whole``'s workloads and configurations)."""
    return workload in WHOLE_WORKLOADS and config in WHOLE_CONFIGS


def parts(workload: str, config: str) -> tuple[str | None, ...]:
    """The names of the parts the child dumps, in order."""
    return STEADY_PARTS + (WHOLE_PARTS if has_whole(workload, config) else ())


@dataclass
class Counts:
    """One (workload, configuration) process: instructions by part, and the wall seconds the process took."""

    instructions: dict[str, int]
    seconds: float


@dataclass
class InstructionResult:
    """One workload's processes by configuration, the configurations that failed, and the wall seconds in all."""

    workload: str
    counts: dict[str, Counts] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    def per_step(self, config: str, window: str) -> float:
        """Instructions per step of ``window`` ("first", "steady", "whole"), or in all ("enter", "exit"); nan if not
        counted."""
        counts = self.counts.get(config)
        if counts is None or window not in counts.instructions:
            return math.nan
        steps = {"first": STEADY_FROM, "steady": steady_steps(self.workload) - STEADY_FROM, "whole": WHOLE_STEPS}
        return counts.instructions[window] / steps.get(window, 1)

    def ratio(self, config: str, window: str) -> float:
        """``config`` / bare over ``window``."""
        return self.per_step(config, window) / self.per_step("bare", window)


# the child: one (workload, configuration) under callgrind


def _fresh(workload: W.Workload) -> None:
    """As ``measure.run_round`` before each session: the workload's carried state starts afresh, then a full
    collection."""
    if workload.begin is not None:
        workload.begin()
    gc.collect()


def _steps(workload: W.Workload, count: int) -> None:
    step = workload.step
    for _ in range(count):
        step()


def _session(workload: W.Workload, config: str, steps: int) -> None:
    with context(config):
        _steps(workload, steps)


def child(name: str, config: str) -> NoReturn:
    """Build and warm up, wait for the parent's line, then run the measured sessions with a mark
    (``os.sched_yield()``) at each boundary of :func:`parts`; leave without the interpreter's teardown."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    workload = W.all_workloads()[name]()
    _fresh(workload)
    _session(workload, config, WARMUP_STEPS)
    _fresh(workload)
    print(READY, flush=True)
    sys.stdin.readline()  # instrumentation is on
    mark = os.sched_yield
    mark()
    session = context(config)
    session.__enter__()
    mark()
    _steps(workload, STEADY_FROM)
    mark()
    _steps(workload, steady_steps(name) - STEADY_FROM)
    mark()
    session.__exit__(None, None, None)
    mark()
    if has_whole(name, config):
        _fresh(workload)
        mark()
        _session(workload, config, WHOLE_STEPS)
        mark()
    os._exit(0)


# the parent: run the children, read their parts


def unavailable() -> str:
    """Why the instructions cannot be counted here ("" if they can)."""
    missing = [tool for tool in ("valgrind", "callgrind_control") if shutil.which(tool) is None]
    return f"{' and '.join(missing)} not installed (the valgrind package)" if missing else ""


def child_env() -> dict[str, str]:
    """This environment, with one BLAS thread and a fixed hash seed (the same dict and set orders every run)."""
    return dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONHASHSEED="0")


def count(workload: str, config: str, workdir: Path) -> Counts:
    """One child under callgrind: its parts' instructions by name."""
    started = time.perf_counter()
    out = workdir / f"callgrind.out.{workload}.{config}"
    for old in _part_files(out):
        old.unlink()
    argv = [
        "valgrind", "--tool=callgrind", "-q", "--instr-atstart=no", f"--dump-before={MARK}",
        f"--callgrind-out-file={out}", sys.executable, str(Path(__file__)), "--child", f"{workload}:{config}",
    ]  # fmt: skip
    errors = workdir / f"{workload}.{config}.stderr"
    with errors.open("w") as stderr, _process(argv, stderr) as process:
        assert process.stdin is not None and process.stdout is not None
        if not any(line.strip() == READY for line in process.stdout):
            process.wait()
            raise RuntimeError(f"exited {process.returncode} before its measured part: {_tail(errors)}")
        switch = ["callgrind_control", "-i", "on", str(process.pid)]
        done = subprocess.run(switch, capture_output=True, text=True, timeout=300, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"callgrind_control could not switch instrumentation on: {done.stderr or done.stdout}")
        process.stdin.write("\n")
        process.stdin.close()
        process.stdout.read()
        if process.wait() != 0:
            raise RuntimeError(f"exited {process.returncode}: {_tail(errors)}")
    names = parts(workload, config)
    files = _part_files(out)
    if len(files) != len(names):
        raise RuntimeError(f"callgrind dumped {len(files)} parts at {MARK}, {len(names)} expected: a mark was missed "
                           f"or {MARK} ran elsewhere")  # fmt: skip
    totals = {name: _summary(path) for name, path in zip(names, files) if name is not None}
    return Counts(totals, time.perf_counter() - started)


@contextmanager
def _process(argv: list[str], stderr: IO[str]) -> Iterator[subprocess.Popen[str]]:
    """The child process; killed if the parent gives up on it."""
    process = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True, env=child_env()
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _part_files(out: Path) -> list[Path]:
    """The parts dumped at a mark (``OUT.1``, ``OUT.2``, ...), in order; the last part, at exit, is ``OUT``."""
    numbered = re.compile(re.escape(out.name) + r"\.(\d+)")
    found = {int(m.group(1)): p for p in out.parent.iterdir() if (m := numbered.fullmatch(p.name))}
    return [found[n] for n in sorted(found)]


def _summary(path: Path) -> int:
    """The instructions a dumped part counted (its header's ``summary:`` line)."""
    with path.open() as lines:
        for line in lines:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError(f"{path}: no summary line")


def _tail(path: Path) -> str:
    lines = path.read_text(errors="replace").strip().splitlines()
    return " / ".join(lines[-3:]) or "no message"


def measure_instructions(
    workloads: list[str], configs: list[str], jobs: int, log: Log, keep: Path | None = None
) -> dict[str, InstructionResult]:
    """Every (workload, configuration) in its own process, ``jobs`` at a time, workload after workload."""
    results: dict[str, InstructionResult] = {}
    with tempfile.TemporaryDirectory() as scratch:
        workdir = keep or Path(scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        for name in workloads:
            result = results[name] = InstructionResult(name)
            started = time.perf_counter()
            log(f"instructions, {name}: {', '.join(configs)} under callgrind, {jobs} at a time")
            with ThreadPoolExecutor(max_workers=jobs) as pool:
                futures = {config: pool.submit(count, name, config, workdir) for config in configs}
                for config, future in futures.items():
                    try:
                        result.counts[config] = future.result()
                    except (RuntimeError, subprocess.SubprocessError) as exc:  # (a timeout among them)
                        result.errors[config] = str(exc)
                        log(f"  ! {name} / {config} failed: {exc}")
                        continue
                    log(f"  {name} / {config}: {_per_step_line(result, config)} ({result.counts[config].seconds:.0f} s)")
            result.seconds = time.perf_counter() - started
    return results


def _per_step_line(result: InstructionResult, config: str) -> str:
    windows = ("steady", "whole") if "whole" in result.counts[config].instructions else ("steady",)
    return ", ".join(f"{window} {fmt_instr(result.per_step(config, window))}/step" for window in windows)


# the section


def fmt_instr(value: float) -> str:
    if math.isnan(value):
        return "-"
    return f"{value / 1e3:.1f}k" if value < 1e6 else f"{value / 1e3:,.0f}k" if value < 1e8 else f"{value / 1e6:,.0f}M"


def _fmt_ratio(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}x"


def _windows(result: InstructionResult) -> list[tuple[str, str, bool]]:
    """The table's windows of a workload: (part, label, whether a ratio to bare means anything)."""
    steps = steady_steps(result.workload)
    windows = [
        ("steady", f"steps {STEADY_FROM}-{steps - 1} of {steps}, per step", True),
        ("first", f"steps 0-{STEADY_FROM - 1}, per step", True),
        ("enter", "entering the session, in all", False),
        ("exit", "leaving it, in all", False),
    ]
    if any("whole" in c.instructions for c in result.counts.values()):
        windows.append(("whole", f"whole run of {WHOLE_STEPS} steps, entering and leaving included, per step", True))
    return windows


def section(results: dict[str, InstructionResult]) -> list[str]:
    """RESULTS.md's section: instructions per step and ratios to bare, then issue 42's goals counted so."""
    configs = [c for c in CONFIGS if c != "bare" and any(c in r.counts or c in r.errors for r in results.values())]
    lines = [
        "## Instructions per step (callgrind)",
        "",
        (
            "Counted by valgrind's callgrind (`benchmarks/instructions.py`): each workload and configuration in a fresh "
            "single-threaded process running the sessions the time measures run (a 2-step warm-up session, the "
            "steady-state session, the whole run), with no clock read around the steps. A process counts the same "
            "instructions every run, where the CPU-time ratios move by several percent; another memory layout "
            "(environment, paths) moves the counts by a few tenths of a percent. The ratios sit below the time ratios, "
            "by a factor that depends on the workload (bare runs its instructions faster than graphwatch's Python runs "
            "its own, most of all in torch's kernels): they compare commits exactly, they do not judge a goal in time. "
            "Entering and "
            "leaving are counted in all (no ratio: bare enters nothing). Wall time: "
            + ", ".join(f"{r.workload} {r.seconds:.0f} s" for r in results.values())
            + "."
        ),
        "",
        "| " + " | ".join(["workload", "window", "bare", *configs]) + " |",
        "|---|---|---|" + "---|" * len(configs),
    ]
    for r in results.values():
        for window, label, paired in _windows(r):
            cells = [_cell(r, c, window, paired and c != "bare") for c in ["bare", *configs]]
            lines.append(f"| {r.workload} | {label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Issue 42's goals, counted in instructions (in time: RESULTS.md's goals table):",
        "",
        "| workload | default level, steady state | default level, whole run | light level's distance to `light_floor`, "
        "steady state |",
        "|---|---|---|---|",
        *(_goal_row(r) for r in results.values()),
        "",
    ]
    failed = [f"- {r.workload} / `{c}` failed: {e}" for r in results.values() for c, e in r.errors.items()]
    return lines + ([*failed, ""] if failed else [])


def _cell(r: InstructionResult, config: str, window: str, ratio: bool) -> str:
    value = r.per_step(config, window)
    if math.isnan(value):
        return "failed" if config in r.errors else "-"
    return fmt_instr(value) + (f", **{_fmt_ratio(r.ratio(config, window))}**" if ratio else "")


def _goal_row(r: InstructionResult) -> str:
    steady, whole = r.ratio("gw", "steady"), r.ratio("gw", "whole")
    light, floor = r.ratio("light", "steady"), r.ratio("light_floor", "steady")
    distance = light - floor
    cells = [
        _goal(steady, f"<= {STEADY_GOAL:.2f}x", steady <= STEADY_GOAL, _fmt_ratio(steady)),
        _goal(whole, f"<= {WHOLE_GOAL:.2f}x", whole <= WHOLE_GOAL, _fmt_ratio(whole)),
        _goal(distance, f"<= +{LIGHT_MARGIN:.2f}", distance <= LIGHT_MARGIN,
              f"{_fmt_ratio(light)} against {_fmt_ratio(floor)}: {distance:+.3f}"),
    ]  # fmt: skip
    return f"| {r.workload} | " + " | ".join(cells) + " |"


def _goal(value: float, goal: str, met: bool, shown: str) -> str:
    if math.isnan(value):
        return "-"
    return f"{shown} (goal {goal}: {'met' if met else '**MISSED**'})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--only", default=",".join(DEFAULT_WORKLOADS), help="comma-separated workloads (default %(default)s)")
    add("--configs", default=",".join(DEFAULT_CONFIGS), help="comma-separated configurations (default %(default)s)")
    add("--jobs", type=int, default=2, help="processes at a time (default 2)")
    add("--keep", type=Path, help="keep callgrind's profiles in this folder (callgrind_annotate reads them)")
    add("--out", type=Path, help="also write the Markdown section here")
    add("--child", help=argparse.SUPPRESS)  # WORKLOAD:CONFIG, run by the parent under callgrind
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child.split(":"))
    workloads = [w for w in args.only.split(",") if w]
    configs = [c for c in args.configs.split(",") if c]
    unknown = sorted(set(workloads) - set(W.all_workloads())) + sorted(set(configs) - set(CONFIGS))
    if unknown:
        parser.error(f"unknown workloads or configurations: {unknown}")
    if "bare" not in configs:
        configs.insert(0, "bare")
    why = unavailable()
    if why:
        print(f"instructions: skipped, {why}")
        return 0
    started = time.perf_counter()
    results = measure_instructions(workloads, configs, args.jobs, partial(print, flush=True), args.keep)
    text = "\n".join(section(results))
    print(f"\n{text}\n({time.perf_counter() - started:.0f} s)")
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
