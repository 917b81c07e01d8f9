"""Cost per step of a loop that keeps every step's graph (``total_loss += loss``), bare and watched.

The flagship bug keeps one more graph alive each step.  graphwatch's work at a
step end must not grow with the graphs kept: this prints the CPU time per step
over the first and the last ``--window`` steps of ``--steps``, bare and under
``graphwatch.watch()``, and the ratio last/first of each.

    .venv/bin/python benchmarks/kept_graphs.py --steps 10000 --window 1000
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

import graphwatch


def run(steps: int, watched: bool) -> list[float]:
    """CPU seconds of each step."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(64, 4, 8)
    seconds = []
    session = graphwatch.watch(summary=False) if watched else contextlib.nullcontext()
    with session:
        total_loss = 0
        for step in range(steps):
            started = time.process_time()
            loss = model(data[step % 64]).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total_loss += loss  # the bug: keeps every step's graph
            seconds.append(time.process_time() - started)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--window", type=int, default=1_000)
    args = parser.parse_args()
    window = min(args.window, args.steps // 2)
    for watched in (False, True):
        seconds = run(args.steps, watched)
        first, last = statistics.mean(seconds[:window]) * 1e3, statistics.mean(seconds[-window:]) * 1e3
        name = "graphwatch" if watched else "bare"
        print(f"{name:>10}: first {window} steps {first:.3f} ms/step, last {window} {last:.3f} ms/step, "
              f"last/first {last / first:.2f}x")


if __name__ == "__main__":
    main()
