"""Interleaved timing: rounds of every configuration on the same loop, and their medians.

A round runs one configuration for a number of steps inside one context
(session, profiler, anomaly mode).  Every step is timed as CPU time of the
process (the measure) and wall time; a graphwatch session also gets its graph
walk, step end and snapshot timed by wrapping those methods on the instance.
:func:`measure` warms up each configuration, then runs rounds whose order of
(workload, configuration) pairs rotates, so drift on a shared machine hits all
of them alike.  :class:`WorkloadResult` gives medians over rounds and the
*paired* ratios (configuration / bare of the same round).
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import workloads as W
from configs import context

import graphwatch

Shape = tuple[W.Workload, int, int]  # workload, steps per round, rounds
Log = Callable[[str], None]


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def fmt_x(x: float) -> str:
    """A ratio as RESULTS.md shows it ("-" if not measured)."""
    return "-" if math.isnan(x) else f"{x:.2f}x"


def quartiles(values: list[float]) -> tuple[float, float]:
    """First and third quartile; min and max with fewer than 4 values."""
    if len(values) < 4:
        return (min(values), max(values)) if values else (float("nan"), float("nan"))
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


@dataclass
class RoundResult:
    """One configuration's round: per-step CPU time (the measure) and wall time, plus graphwatch's own work."""

    cpu_s: list[float]  # process CPU time per step (time.process_time): what the step cost this process
    wall_s: list[float]  # wall time per step (time.perf_counter): also waits for the shared CPU
    enter_s: float = 0.0
    exit_s: float = 0.0
    walk_s: list[float] = field(default_factory=list)  # wall s of BackwardWatch.walk_before calls (incl. snapshots)
    end_step_s: list[float] = field(default_factory=list)  # wall s of Session._end_step calls
    snapshot_s: list[float] = field(default_factory=list)  # wall s of BackwardWatch.snapshot calls
    recursion_limit: int | None = None  # the low limit a deep workload ran under

    @property
    def mean_ms(self) -> float:
        return 1e3 * sum(self.cpu_s) / len(self.cpu_s)

    @property
    def steady_ms(self) -> float:
        """Mean CPU ms/step without the session's first step (its snapshot, first walk, site interning)."""
        rest = self.cpu_s[1:] or self.cpu_s
        return 1e3 * sum(rest) / len(rest)

    @property
    def wall_ms(self) -> float:
        return 1e3 * sum(self.wall_s) / len(self.wall_s)

    def ms_from(self, first: int) -> float:
        """Mean CPU ms/step over the steps from ``first`` on (a steady state: the first steps left out)."""
        rest = self.cpu_s[first:] or self.cpu_s
        return 1e3 * sum(rest) / len(rest)

    @property
    def whole_ms(self) -> float:
        """CPU ms of the whole round: entering the context, every step, leaving it."""
        return 1e3 * (self.enter_s + sum(self.cpu_s) + self.exit_s)


def _timed(method: Callable[..., Any], sink: list[float]) -> Callable[..., Any]:
    # wall clock (a vDSO read): the CPU clock is a system call (about 1 us here), which at every step end would be
    # charged to graphwatch's ratios and not to the floors' (their step ends are not wrapped)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            sink.append(time.perf_counter() - started)

    return wrapper


def _instrument(session: Any, result: RoundResult) -> None:
    """Time the session's per-backward graph walk, its step ends and its snapshots (instance attributes)."""
    backwards = getattr(session, "_backwards", None)
    for owner, name, sink in (
        (backwards, "walk_before", result.walk_s),
        (session, "_end_step", result.end_step_s),
        (backwards, "snapshot", result.snapshot_s),
    ):
        method = getattr(owner, name, None)
        if method is not None:
            setattr(owner, name, _timed(method, sink))


def _depth() -> int:
    frame, depth = sys._getframe(), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return depth


@contextlib.contextmanager
def recursion_limit(active: bool, headroom: int) -> Iterator[int | None]:
    """If ``active``, the recursion limit is the current depth + ``headroom``: graph-sized recursion fails at once."""
    if not active:
        yield None
        return
    old = sys.getrecursionlimit()
    limit = _depth() + headroom
    sys.setrecursionlimit(limit)
    try:
        yield limit
    finally:
        sys.setrecursionlimit(old)


def run_round(workload: W.Workload, config: str, steps: int, headroom: int) -> RoundResult:
    if workload.begin is not None:
        workload.begin()
    gc.collect()
    result = RoundResult([], [])
    cpu, wall = result.cpu_s, result.wall_s
    with recursion_limit(workload.deep, headroom) as result.recursion_limit:
        ctx = context(config)
        started = time.process_time()
        entered = ctx.__enter__()
        result.enter_s = time.process_time() - started
        if isinstance(entered, graphwatch.Session):
            _instrument(entered, result)
        try:
            step = workload.step
            perf, proc = time.perf_counter, time.process_time
            for _ in range(steps):
                t, c = perf(), proc()
                step()
                c2, t2 = proc(), perf()
                cpu.append(c2 - c)
                wall.append(t2 - t)
        except BaseException as exc:
            ctx.__exit__(type(exc), exc, exc.__traceback__)
            raise
        started = time.process_time()
        ctx.__exit__(None, None, None)
        result.exit_s = time.process_time() - started
    return result


@dataclass
class WorkloadResult:
    workload: W.Workload
    steps: int
    rounds: int
    configs: list[str]  # the configurations measured (failed ones left out)
    results: dict[str, list[RoundResult]]
    errors: dict[str, str]  # configuration -> why it failed
    seconds: float = 0.0

    @property
    def recursion_limit(self) -> int | None:
        return max((r.recursion_limit for rs in self.results.values() for r in rs if r.recursion_limit), default=None)

    def ms(self, config: str) -> float:
        return med([r.mean_ms for r in self.results.get(config, [])])

    def calls(self, config: str, what: str) -> list[float]:
        """All timed calls of one session method over the rounds: ``what`` is walk_s, end_step_s or snapshot_s."""
        return [x for r in self.results.get(config, []) for x in getattr(r, what)]

    def paired(self, config: str, base: str = "bare", steady: bool = False, wall: bool = False) -> list[float]:
        """Per round: configuration / base of the same round."""
        key = "wall_ms" if wall else "steady_ms" if steady else "mean_ms"
        a, b = self.results.get(config, []), self.results.get(base, [])
        return [getattr(x, key) / getattr(y, key) for x, y in zip(a, b)]

    def ratio(self, config: str, base: str = "bare", steady: bool = False, wall: bool = False) -> float:
        return med(self.paired(config, base, steady, wall))

    def ratio_from(self, config: str, first: int, base: str = "bare") -> float:
        """Median over rounds of (configuration / base of the same round), over the steps from ``first`` on."""
        a, b = self.results.get(config, []), self.results.get(base, [])
        return med([x.ms_from(first) / y.ms_from(first) for x, y in zip(a, b)])

    def whole_ratio(self, config: str, base: str = "bare") -> float:
        """Median over rounds of (configuration / base of the same round), whole rounds (enter and exit too)."""
        a, b = self.results.get(config, []), self.results.get(base, [])
        return med([x.whole_ms / y.whole_ms for x, y in zip(a, b)])


def _failure(exc: BaseException) -> str:
    kind = "RecursionError under the low recursion limit" if isinstance(exc, RecursionError) else type(exc).__name__
    first = str(exc).splitlines()[0][:160] if str(exc) else ""
    return f"{kind}: {first} ({_where(exc)})"


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        if "graphwatch" in frame.filename and "benchmarks" not in frame.filename:
            return f"{os.path.relpath(frame.filename)}:{frame.lineno} in {frame.name}"
    if frames:
        frame = frames[-1]
        return f"{os.path.basename(frame.filename)}:{frame.lineno} in {frame.name}"
    return "?"


def measure(group: list[Shape], configs: list[str], headroom: int, log: Log) -> dict[str, WorkloadResult]:
    """Warm up, then rounds of every (workload, configuration) pair of the group in rotating order."""
    started = time.perf_counter()
    errors: dict[str, dict[str, str]] = {w.name: {} for w, _, _ in group}
    configs = list(configs)
    # warm-up on the group's first (smallest) workload: one short untimed round per configuration; drop what fails
    first, first_steps, _ = group[0]
    for config in list(configs):
        try:
            run_round(first, config, min(first_steps, 2), headroom)
        except Exception as exc:
            for e in errors.values():
                e[config] = "warm-up: " + _failure(exc)
            configs.remove(config)
            log(f"  ! {config} failed in warm-up: {errors[first.name][config]}")
    pairs = [(w, steps, c) for w, steps, _ in group for c in configs if c not in w.skip]
    results: dict[str, dict[str, list[RoundResult]]] = {w.name: {} for w, _, _ in group}
    rounds = max(r for _, _, r in group)
    for i in range(rounds):
        k = i % len(pairs) if pairs else 0
        for w, steps, config in pairs[k:] + pairs[:k]:
            if config in errors[w.name]:
                continue
            try:
                results[w.name].setdefault(config, []).append(run_round(w, config, steps, headroom))
            except Exception as exc:
                errors[w.name][config] = f"round {i}: " + _failure(exc)
                log(f"  ! {w.name} / {config} failed: {errors[w.name][config]}")
                results[w.name].pop(config, None)
        if i == 0 or (i + 1) % max(1, rounds // 4) == 0:
            for w, _, _ in group:
                done = ", ".join(f"{c} {med([r.mean_ms for r in rs]):.2f}" for c, rs in results[w.name].items())
                log(f"  {w.name} round {i + 1}/{rounds}: ms/step {done}")
    seconds = time.perf_counter() - started
    return {
        w.name: WorkloadResult(
            w, steps, rounds, [c for c in configs if c in results[w.name]], results[w.name], errors[w.name], seconds
        )
        for w, steps, rounds in group
    }
