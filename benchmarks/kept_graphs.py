"""Cost per step of a loop that keeps every step's graph (``total_loss += loss``), bare and watched.

The flagship bug keeps one more graph alive each step.  graphwatch's work at a
step end must not grow with the graphs kept: this prints the CPU time per step
over the first and the last ``--window`` steps of ``--steps``, bare and under
``graphwatch.watch()``, and the ratio last/first of each; then the same windows
split into the time Python's cyclic garbage collector took inside the steps
(timed by ``gc.callbacks``) and the rest, with the full (oldest-generation)
collections each window met.

    .venv/bin/python benchmarks/kept_graphs.py --steps 10000 --window 1000
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import time
from dataclasses import dataclass, field
from typing import Any

import torch

import graphwatch


@dataclass
class Timings:
    """CPU seconds of each step, and of the collector inside it; the steps that met a full collection."""

    seconds: list[float] = field(default_factory=list)
    collector: list[float] = field(default_factory=list)
    full: list[int] = field(default_factory=list)

    def window(self, lo: int, hi: int) -> tuple[float, float, int]:
        """(ms/step, collector ms/step, full collections) over steps [lo, hi)."""
        n = hi - lo
        return (
            sum(self.seconds[lo:hi]) / n * 1e3,
            sum(self.collector[lo:hi]) / n * 1e3,
            sum(1 for step in self.full if lo <= step < hi),
        )


def run(steps: int, watched: bool) -> Timings:
    """Time each step of the loop, and the collector's share of it."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(64, 4, 8)
    timings = Timings()
    in_step, started = [False], [0.0]

    def on_collection(phase: str, info: dict[str, Any]) -> None:
        if not in_step[0]:
            return
        if phase == "start":
            started[0] = time.process_time()
        else:
            timings.collector[-1] += time.process_time() - started[0]
            if info["generation"] == 2:
                timings.full.append(len(timings.seconds))

    gc.callbacks.append(on_collection)
    session = graphwatch.watch(summary=False) if watched else contextlib.nullcontext()
    try:
        with session:
            total_loss = 0
            for step in range(steps):
                timings.collector.append(0.0)
                in_step[0] = True
                began = time.process_time()
                loss = model(data[step % 64]).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                total_loss += loss  # the bug: keeps every step's graph
                timings.seconds.append(time.process_time() - began)
                in_step[0] = False
    finally:
        gc.callbacks.remove(on_collection)
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--window", type=int, default=1_000)
    args = parser.parse_args()
    window = min(args.window, args.steps // 2)
    last = args.steps - window
    for watched in (False, True):
        timings = run(args.steps, watched)
        first_ms, first_gc, first_full = timings.window(0, window)
        last_ms, last_gc, last_full = timings.window(last, args.steps)
        name = "graphwatch" if watched else "bare"
        print(f"{name:>10}: first {window} steps {first_ms:.3f} ms/step, last {window} {last_ms:.3f} ms/step, "
              f"last/first {last_ms / first_ms:.2f}x")
        print(f"{'':>10}  without the collector: first {first_ms - first_gc:.3f}, last {last_ms - last_gc:.3f} ms/step, "
              f"last/first {(last_ms - last_gc) / (first_ms - first_gc):.2f}x; the collector: first {first_gc:.3f} "
              f"ms/step ({first_full} full), last {last_gc:.3f} ms/step ({last_full} full), whole run "
              f"{sum(timings.collector) / args.steps * 1e3:.3f} ms/step ({len(timings.full)} full)")


if __name__ == "__main__":
    main()
