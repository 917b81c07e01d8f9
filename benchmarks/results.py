"""RESULTS.md: the machine, the targets, the tables of ratios, instructions per step, deep graphs, the long run and
the profile."""

from __future__ import annotations

import math
import os
import platform
import resource
import subprocess
import time
from pathlib import Path
from typing import Any

import torch
import workloads as W
from adaptive import STEADY_FROM, WHOLE_CONFIGS, KeptWindows
from configs import CONFIGS, GW_CONFIGS
from deep_graph import scaling
from instructions import InstructionResult, section
from longrun import LongRun, mb
from measure import WorkloadResult, fmt_x, med, quartiles
from targets import issue_15_rows, small_step_rows, targets
from whole_process import ProcessResult

import graphwatch
from graphwatch.capture.steps.detail import SAMPLE_EVERY, SAMPLED_EARLY

HERE = Path(__file__).resolve().parent


def fmt_ms(x: float) -> str:
    if math.isnan(x):
        return "-"
    return f"{x:.3f}" if x < 10 else f"{x:.1f}" if x < 1000 else f"{x:,.0f}"


def load_average() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def machine() -> dict[str, str]:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    stack = resource.getrlimit(resource.RLIMIT_STACK)[0]
    return {
        "CPU": cpu,
        "cores": str(os.cpu_count()),
        "torch threads": str(torch.get_num_threads()),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "graphwatch": f"{graphwatch.__version__} ({_git_rev()})",
        "stack limit (soft RLIMIT_STACK) at start": "unlimited" if stack == resource.RLIM_INFINITY else mb(stack),
        "load average at start (1/5/15 min)": load_average(),
    }


def _git(*args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(HERE.parent), *args], capture_output=True, text=True, timeout=5, check=False
    )
    return done.stdout.strip()


def _git_rev() -> str:
    try:
        dirty = _git("status", "--porcelain", "src/graphwatch")
        return _git("rev-parse", "--short", "HEAD") + (" + uncommitted changes in src/graphwatch/" if dirty else "")
    except Exception:
        return "?"


def write_results(
    path: Path,
    info: dict[str, str],
    results: dict[str, WorkloadResult],
    long: LongRun | None,
    prof: dict[str, Any] | None,
    *,
    quick: bool,
    wall: float,
    headroom: int,
    steady: dict[str, WorkloadResult] | None = None,
    whole: dict[str, WorkloadResult] | None = None,
    kept: KeptWindows | None = None,
    process: ProcessResult | None = None,
    instructions: dict[str, InstructionResult] | None = None,
) -> str:
    mode = "quick" if quick else "full"
    lines = [
        "# graphwatch overhead benchmark results",
        "",
        (
            f"Written by `benchmarks/run.py{' --quick' if quick else ''}` on {time.strftime('%Y-%m-%d %H:%M:%S %Z')} "
            f"({mode} run, {wall / 60:.1f} min wall). See `benchmarks/README.md` for the method."
        ),
        "",
        "## Machine",
        "",
        *(f"- {k}: {v}" for k, v in info.items()),
        f"- load average at end: {load_average()}",
        "",
        (
            "The machine is shared (other engineers run test suites on its 2 cores; see the load averages), so wall time "
            "mostly measures waiting for a core. **All ms figures are CPU time of this process** (`time.process_time`, which "
            "includes any helper threads, e.g. the profiler's), but for graphwatch's own calls (walk, step end, "
            "snapshot: wall clock, a vDSO read, where the CPU clock's system call would be charged to its ratios), and "
            "ratios are medians of *paired* rounds (each configuration "
            "against the bare run of the same round, order rotated), which cancels most of the remaining drift. Wall-time "
            "ratios are listed too, for comparison. IQR columns show how much the paired ratio moved from round to round."
        ),
        "",
        "## Configurations",
        "",
        *(f"- `{name}`: {desc}" for name, (desc, _) in CONFIGS.items()),
        "",
        *_small_step_section(steady or {}, whole or {}, kept, process),
        *(section(instructions) if instructions else []),
        "## Targets (issue 5)",
        "",
        "| target | goal | measured | status |",
        "|---|---|---|---|",
        *(t.row() for t in targets(results, long, headroom)),
        "",
        "## Goals of issue 15, beside the Python floor",
        "",
        (
            "graphwatch default / bare over all steps of a round (in brackets: the steps after each round's first), and "
            "the same for `floor`: a pack hook whose handle keeps what torch keeps and counts itself in `__del__`, the "
            "least any Python tool that knows each saved tensor's lifetime does (no graphwatch code runs). A goal below "
            "the floor cannot be met by graphwatch's Python however fast the rest gets (`benchmarks/README.md`: what "
            "torch would need)."
        ),
        "",
        "| workload | goal | graphwatch default | floor | status |",
        "|---|---|---|---|---|",
        *issue_15_rows(results),
        "",
    ]
    lines += _ratio_tables(results)
    small, big = results.get("rnn10k"), results.get("rnn100k")
    if small and big:
        lines += _deep_section(small, big, headroom)
    lines += _failures(results)
    if long is not None:
        lines += _long_section(long)
    if prof is not None:
        lines += _profile_section(prof)
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def _small_step_section(
    steady: dict[str, WorkloadResult],
    whole: dict[str, WorkloadResult],
    kept: KeptWindows | None,
    process: ProcessResult | None,
) -> list[str]:
    """Issue 42's goals (small steps) and issue 25's that stand, the steady-state table beside them."""
    if not steady and not whole and kept is None and process is None:
        return []
    lines = [
        "## Goals of issue 42 (small steps) and of issue 25 (adaptive capture), beside the Python floors",
        "",
        (
            "The default level sees the first steps, sampled steps and suspicious steps in full detail and the others at "
            "the light level's cost (`src/graphwatch/capture/steps/detail.py`). Steady state: the mean CPU time per step from step "
            f"{STEADY_FROM} on of sessions of the listed length, as a median over rounds of the paired ratio to bare; the "
            f"sampled steps ({', '.join(map(str, SAMPLED_EARLY))}, then every {SAMPLE_EVERY}th) are in it. `floor` is the "
            "least a Python tool that knows every saved "
            "tensor's lifetime costs (see Configurations): what full detail on every step cannot go below (a full step); "
            "`light_floor` is what keeping the light level's figures costs with no records or analysis: what a light step "
            "(the light level's, and the default level's between its full steps) cannot go below. The step-per-backward "
            "row runs `benchmarks/workloads.py` as a script in fresh processes, `python` against `python -m graphwatch "
            "run` (`whole_process.py`): CPU time of the whole process, Python's start and `import torch` included."
        ),
        "",
        "| measure | goal | measured | floor | status |",
        "|---|---|---|---|---|",
        *small_step_rows(steady, whole, kept, process),
        "",
    ]
    configs = [c for c in CONFIGS if any(c in r.results for r in steady.values())]
    if steady:
        lines += [
            "### Steady state: CPU ms/step and ratio to bare",
            "",
            "| workload | steps x rounds | " + " | ".join(configs) + " |",
            "|---|---|" + "---|" * len(configs),
        ]
        for r in steady.values():
            cells = []
            for c in configs:
                if c not in r.results:
                    cells.append(_missing(r, c))
                    continue
                ms = med([x.ms_from(STEADY_FROM) for x in r.results[c]])
                cells.append(f"{fmt_ms(ms)} ms" + ("" if c == "bare" else f", **{fmt_x(r.ratio_from(c, STEADY_FROM))}**"))
            lines.append(f"| {r.workload.name} | {r.steps} x {r.rounds} | " + " | ".join(cells) + " |")
        lines.append("")
    if whole:
        lines += [
            "### Whole runs (entering and leaving the session included)",
            "",
            "| workload | steps x rounds | bare ms | default ms, ratio | light ms, ratio | light_floor ms, ratio |",
            "|---|---|---|---|---|---|",
        ]
        for r in whole.values():
            whole_ms = {c: med([x.whole_ms for x in r.results[c]]) for c in WHOLE_CONFIGS if c in r.results}
            cells = [
                f"{fmt_ms(whole_ms[c])} ms, **{fmt_x(r.whole_ratio(c))}**" if c in whole_ms else "-"
                for c in WHOLE_CONFIGS[1:]
            ]
            bare = fmt_ms(whole_ms.get("bare", math.nan))
            lines.append(f"| {r.workload.name} | {r.steps} x {r.rounds} | {bare} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def _missing(result: WorkloadResult, config: str) -> str:
    """The table cell of a configuration that has no figures for a workload."""
    return "skipped" if config in result.workload.skip else ("failed" if config in result.errors else "-")


def _ratio_tables(results: dict[str, WorkloadResult]) -> list[str]:
    configs = list(CONFIGS)
    lines = [
        "## Median CPU ms/step and ratio to bare",
        "",
        (
            "ms/step: CPU time, mean over the round's steps (first step included), median over rounds. Ratio: median over "
            "rounds of (configuration / bare of the same round). Steady: the same with each round's first step left out (the "
            "first step of a session pays its snapshot, first graph walk and call-site interning)."
        ),
        "",
        "| workload | nodes/step | steps x rounds | " + " | ".join(configs) + " |",
        "|---|---|---|" + "---|" * len(configs),
    ]
    for r in results.values():
        cells = []
        for c in configs:
            if c not in r.results:
                cells.append(_missing(r, c))
            else:
                cells.append(f"{fmt_ms(r.ms(c))} ms" + ("" if c == "bare" else f", **{fmt_x(r.ratio(c))}**"))
        lines.append(
            f"| {r.workload.name} | {r.workload.nodes:,} | {r.steps} x {r.rounds} | " + " | ".join(cells) + " |"
        )
    lines += [
        "",
        "### Ratios in detail",
        "",
        (
            "| workload | config | ratio (all steps) | IQR | steady ratio | wall-time ratio | enter+exit ms | first step ms | "
            "walk ms/backward | step end ms/step | snapshot ms |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results.values():
        for c in r.configs:
            if c == "bare":
                continue
            rounds = r.results[c]
            lo, hi = quartiles(r.paired(c))
            timed = " | ".join(fmt_ms(1e3 * med(r.calls(c, what))) for what in ("walk_s", "end_step_s", "snapshot_s"))
            lines.append(
                f"| {r.workload.name} | {c} | {fmt_x(r.ratio(c))} | {lo:.2f}-{hi:.2f} | {fmt_x(r.ratio(c, steady=True))} | "
                f"{fmt_x(r.ratio(c, wall=True))} | {fmt_ms(1e3 * med([rr.enter_s + rr.exit_s for rr in rounds]))} | "
                f"{fmt_ms(1e3 * med([rr.cpu_s[0] for rr in rounds]))} | {timed} |"
            )
    lines += [
        "",
        "### detect_anomaly and profiler against graphwatch default",
        "",
        "| workload | anomaly / gw | profiler / gw | gw / light |",
        "|---|---|---|---|",
    ]
    for r in results.values():
        if "gw" in r.results:
            cells = [fmt_x(r.ratio(a, b)) if a in r.results and b in r.results else "-" for a, b in _AGAINST_GW]
            lines.append(f"| {r.workload.name} | " + " | ".join(cells) + " |")
    return [*lines, ""]


_AGAINST_GW = (("anomaly", "gw"), ("profiler", "gw"), ("gw", "light"))


def _deep_section(small: WorkloadResult, big: WorkloadResult, headroom: int) -> list[str]:
    lines = [
        "## Deep graphs: 10k vs 100k nodes",
        "",
        (
            f"Recursion limit during these runs: current depth + {headroom} (= {big.recursion_limit}); Python's default is "
            "1000. They run in the benchmark's own process, at the stack limit listed under Machine; a graphwatch session "
            "raises the main thread's soft RLIMIT_STACK while it watches (torch frees walked chains recursively: README.md)."
        ),
        "",
        (
            "Both sizes run in the same rounds of the same process (interleaved), and 100k / 10k is the median over rounds "
            "of the paired ratio. Each round runs 3 steps in one session: the first pays the session's one-off work (the "
            "first-backward snapshot, full records), the others the steady per-step cost."
        ),
        "",
        "| config | 10k ms/step | 100k ms/step | 100k / 10k | 100k / 10k after the first step | node ratio |",
        "|---|---|---|---|---|---|",
    ]
    node_ratio = big.workload.nodes / max(small.workload.nodes, 1)
    for c in CONFIGS:
        if c in small.results and c in big.results:
            added = scaling(small, big, c, added=True)
            extra = (
                ""
                if c == "bare"
                else " (added cost over bare: within noise)"
                if math.isnan(added)
                else f" (added cost over bare: {added:.2f}x)"
            )
            steady = scaling(small, big, c, steady=True)
            lines.append(
                f"| {c} | {fmt_ms(small.ms(c))} | {fmt_ms(big.ms(c))} | {scaling(small, big, c):.2f}x{extra} "
                f"| {steady:.2f}x | {node_ratio:.2f}x |"
            )
    lines += [
        "",
        "graphwatch's own work per step on the deep graphs (medians over calls; worst call in brackets):",
        "",
        "| workload | config | walk before backward | step end | snapshot (first step) |",
        "|---|---|---|---|---|",
    ]
    for r in (small, big):
        for c in GW_CONFIGS:
            if c in r.results:
                cells = " | ".join(
                    _median_and_worst(r.calls(c, what)) for what in ("walk_s", "end_step_s", "snapshot_s")
                )
                lines.append(f"| {r.workload.name} | {c} | {cells} |")
    return [*lines, ""]


def _median_and_worst(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{fmt_ms(1e3 * med(values))} ms ({fmt_ms(1e3 * max(values))} ms)"


def _failures(results: dict[str, WorkloadResult]) -> list[str]:
    errors = [f"- {r.workload.name} / `{c}`: {e}" for r in results.values() for c, e in r.errors.items()]
    skipped = [f"- {r.workload.name}: {r.workload.skip_reason}" for r in results.values() if r.workload.skip]
    if not errors and not skipped:
        return []
    return ["## Failures and skips", "", *errors, *skipped, ""]


def _long_section(long: LongRun) -> list[str]:
    samples = long.rss_samples[:: max(1, len(long.rss_samples) // 6)]
    lines = [
        f"## Long run: {long.steps_done:,} steps of a tiny loop (`workloads.tiny`, keeping one step's graph alive every "
        f"{W.LEAK_EVERY:,} steps) under `{long.config}`",
        "",
    ]
    if long.error:
        lines += [f"**{long.error}**", ""]
    lines += [
        f"- bare: {long.bare_ms:.3f} CPU ms/step; RSS growth over the bare run {mb(long.bare_rss_delta)}",
        (
            f"- under the session: {long.gw_ms_first:.3f} CPU ms/step over the first chunk, {long.gw_ms_last:.3f} over the "
            f"last ({long.gw_seconds:.0f} s wall in all; a rising figure would mean per-step work that grows with the run)"
        ),
        f"- RSS growth over the session run (gc'd, session still open): **{mb(long.rss_delta)}**; samples (step: growth): "
        + ", ".join(f"{step:,}: {mb(growth)}" for step, growth in samples),
        (
            f"- tracemalloc over a separate {long.traced_steps:,}-step session: {mb(long.traced_in_session)} held at its end "
            f"(**{long.traced_per_step:.0f} bytes/step**), {mb(long.traced_after_exit)} still held by the finished session "
            f"(its trace); extrapolated to {long.steps:,} steps: {mb(long.traced_per_step * long.steps)}"
        ),
        f"- session exit (finalize, session findings): {long.exit_s * 1e3:.0f} ms; findings: {long.findings}",
        (
            f"- trace: {long.trace_steps:,} steps, {long.trace_backwards:,} backwards, {long.trace_nodes:,} node records, "
            f"{long.trace_saved:,} saved records, {long.trace_sites:,} sites; JSON **{mb(long.trace_bytes)}** on disk "
            f"({long.trace_bytes / max(long.trace_steps, 1):.0f} bytes/step), written in {long.save_s:.1f} s"
        ),
        "- where the Python memory is (tracemalloc by file, after the traced session's exit):",
        "",
        *(f"  - `{name}`: {mb(size)}" for name, size in long.top_files),
        "",
    ]
    return lines


def _profile_section(prof: dict[str, Any]) -> list[str]:
    lines = [
        f"## What costs what: cProfile of the {prof['workload'].name} loop under graphwatch level={prof['level']!r}",
        "",
        (
            f"From `benchmarks/profile_hot_path.py` ({prof['steps']:,} steps; run it for the full listing). Unprofiled CPU time "
            f"just before: bare {prof['bare_ms']:.3f} ms/step, session {prof['session_ms']:.3f} ms/step "
            f"({prof['session_ms'] / prof['bare_ms']:.2f}x). Under cProfile the step takes {prof['profiled_ms']:.3f} ms; cProfile "
            "inflates Python code (graphwatch's hooks) far more than torch's C++ ops, so the shares below overstate "
            "graphwatch's part, but rank its parts correctly."
        ),
        "",
        "| part (cumulative, nested parts indented) | CPU ms/step under cProfile | share of the profiled step | calls/step |",
        "|---|---|---|---|",
    ]
    for label, ms, share, calls in prof["phases"]:
        indent = len(label) - len(label.lstrip(" "))
        lines.append(f"| {'&nbsp;' * (2 * indent)}{label.strip()} | {ms:.3f} | {share:.1f}% | {calls:.1f} |")
    lines += [
        "",
        "graphwatch's functions by own time (tottime), CPU ms per step under cProfile:",
        "",
        "| function | own | cumulative | calls/step |",
        "|---|---|---|---|",
        *(f"| `{name}` | {tt:.3f} | {ct:.3f} | {calls:.1f} |" for tt, ct, calls, name in prof["own"][:15]),
        "",
    ]
    return lines
