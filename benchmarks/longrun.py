"""The long run: graphwatch's own memory and trace size over many steps of a tiny loop with a periodic leak.

The loop (``workloads.tiny``) keeps one step's graph alive every
``workloads.LEAK_EVERY`` steps, so the session records findings as it goes.

1. the loop bare: its ms/step and RSS growth (the baseline; 0 for this loop);
2. the loop under the session: RSS growth sampled every 10 chunks, CPU
   ms/step over the first and last chunk (does per-step work grow with the
   run?), then the size of ``gw.save()``'s JSON;
3. a shorter session (at most 10,000 steps) under tracemalloc, too slow for
   the full run: the Python bytes graphwatch holds per step, and which files
   allocate them.
"""

from __future__ import annotations

import gc
import os
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import workloads as W
from configs import context
from measure import Log


def mb(n: float) -> str:
    return f"{n / 2**20:.1f} MB"


def _rss() -> int:
    with open("/proc/self/statm", "rb") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@dataclass
class LongRun:
    steps: int
    config: str = "gw"
    steps_done: int = 0
    bare_ms: float = 0.0
    bare_rss_delta: int = 0
    gw_ms_first: float = 0.0  # ms/step over the first chunk
    gw_ms_last: float = 0.0  # ms/step over the last chunk
    gw_seconds: float = 0.0
    rss_delta: int = 0  # RSS growth over the session run (gc'd, session still open)
    rss_samples: list[tuple[int, int]] = field(default_factory=list)  # (step, RSS growth)
    exit_s: float = 0.0
    trace_bytes: int = 0
    save_s: float = 0.0
    trace_steps: int = 0
    trace_nodes: int = 0
    trace_saved: int = 0
    trace_backwards: int = 0
    trace_sites: int = 0
    findings: int = 0
    # a shorter run under tracemalloc: Python memory graphwatch holds, and where
    traced_steps: int = 0
    traced_in_session: int = 0
    traced_after_exit: int = 0
    top_files: list[tuple[str, int]] = field(default_factory=list)
    error: str = ""

    @property
    def traced_per_step(self) -> float:
        return self.traced_in_session / max(self.traced_steps, 1)

    @property
    def memory_estimate(self) -> int:
        """graphwatch's own memory at the end of the full run: the RSS growth beyond the bare loop's."""
        return max(self.rss_delta - max(self.bare_rss_delta, 0), 0)


def long_run(steps: int, config: str, budget_s: float, log: Log) -> LongRun:
    out = LongRun(steps, config=config)
    step = W.tiny()
    for _ in range(200):
        step()
    _bare(out, step)
    log(f"  bare: {out.bare_ms:.3f} ms/step, RSS growth {mb(out.bare_rss_delta)}")
    _watched(out, step, budget_s, log)
    log(f"  session: RSS growth {mb(out.rss_delta)}, trace {mb(out.trace_bytes)} ({out.trace_steps:,} steps)")
    _traced(out, step)
    log(
        f"  tracemalloc over {out.traced_steps:,} steps: {mb(out.traced_in_session)} ({out.traced_per_step:.0f} bytes/step)"
    )
    return out


def _bare(out: LongRun, step: Callable[[], None]) -> None:
    """The loop itself: ms/step and RSS growth."""
    gc.collect()
    rss0 = _rss()
    started = time.process_time()
    for _ in range(out.steps):
        step()
    out.bare_ms = 1e3 * (time.process_time() - started) / out.steps
    gc.collect()
    out.bare_rss_delta = _rss() - rss0


def _watched(out: LongRun, step: Callable[[], None], budget_s: float, log: Log) -> None:
    """The full run under the session: RSS growth, per-step cost trend, trace size."""
    chunk = max(1, min(1000, out.steps // 20))
    gc.collect()
    rss1 = _rss()
    loop_started = time.perf_counter()
    chunk_times: list[float] = []
    with context(out.config) as gw:
        t = time.process_time()
        for i in range(1, out.steps + 1):
            step()
            out.steps_done = i
            if i % chunk:
                continue
            now, cpu_now = time.perf_counter(), time.process_time()
            chunk_times.append(cpu_now - t)
            t = cpu_now
            if i % (chunk * 10) == 0:
                out.rss_samples.append((i, _rss() - rss1))
                log(
                    f"  step {i:,}: {1e3 * chunk_times[-1] / chunk:.3f} ms/step, RSS growth {mb(out.rss_samples[-1][1])}"
                )
            if now - loop_started > budget_s:
                out.error = f"stopped at step {i:,} of {out.steps:,}: the {budget_s:.0f} s budget ran out"
                log("  ! " + out.error)
                break
        out.gw_seconds = time.perf_counter() - loop_started
        gc.collect()
        out.rss_delta = _rss() - rss1
        if not out.rss_samples or out.rss_samples[-1][0] != out.steps_done:
            out.rss_samples.append((out.steps_done, out.rss_delta))
        started = time.perf_counter()
    out.exit_s = time.perf_counter() - started
    if chunk_times:
        out.gw_ms_first = 1e3 * chunk_times[0] / chunk
        out.gw_ms_last = 1e3 * chunk_times[-1] / chunk
    trace = gw.trace
    out.trace_steps, out.trace_nodes, out.trace_saved = len(trace.steps), len(trace.nodes), len(trace.saved)
    out.trace_backwards, out.findings, out.trace_sites = len(trace.backwards), len(trace.findings), len(trace.sites)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        started = time.perf_counter()
        gw.save(path)
        out.save_s = time.perf_counter() - started
        out.trace_bytes = path.stat().st_size
    del gw, trace
    gc.collect()


def _traced(out: LongRun, step: Callable[[], None]) -> None:
    """A shorter session under tracemalloc (it slows every allocation): what graphwatch holds per step, and where."""
    out.traced_steps = min(out.steps_done, 10_000)
    tracemalloc.start(1)
    base = tracemalloc.get_traced_memory()[0]
    with context(out.config):
        for _ in range(out.traced_steps):
            step()
        gc.collect()
        out.traced_in_session = tracemalloc.get_traced_memory()[0] - base
    gc.collect()
    out.traced_after_exit = tracemalloc.get_traced_memory()[0] - base
    snapshot = tracemalloc.take_snapshot()
    tracemalloc.stop()
    out.top_files = [(_shown_path(st.traceback[0].filename), st.size) for st in snapshot.statistics("filename")[:8]]


def _shown_path(filename: str) -> str:
    """A file as RESULTS.md names it: installed packages from their ``site-packages`` folder, the rest relative
    to the working directory (the repository), never this machine's absolute paths."""
    _, found, tail = filename.partition(os.sep + "site-packages" + os.sep)
    return "site-packages/" + tail if found else os.path.relpath(filename)
