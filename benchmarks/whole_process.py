"""A step-per-backward script's whole process under graphwatch against the same script bare (issue 42).

The script is ``workloads.py`` run as a program: :data:`workloads.SGD_STEPS` tiny steps of manual SGD with no
optimizer (``workloads.manual_sgd``, the shape of PyTorch's ``examples/regression``), then its parameters' sums.
Three commands, each a fresh interpreter, timed in rounds whose order rotates by one each round:

- ``bare``: ``python workloads.py``;
- ``default``: ``python -m graphwatch run --out DIR workloads.py`` (report written, as a user runs it);
- ``light``: the same with ``--level light``.

The measure is each process's CPU time (user + system, from ``os.wait4``): starting Python, ``import torch``,
the loop and, under graphwatch, its import, session and report. Ratios are medians over rounds of the paired ratio
to the bare process of the same round. The children find compiled bytecode (``import_cost.child_env``), and every
run must print the same sums as the bare one: graphwatch must not change what the script computes.

    .venv/bin/python benchmarks/whole_process.py --rounds 7
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from import_cost import Timing, child_env, time_process

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "workloads.py"
COMMANDS = ("bare", "default", "light")
Log = Callable[[str], None]


@dataclass
class ProcessResult:
    """The timed processes of every command, by command, and the script's steps."""

    steps: int
    timings: dict[str, list[Timing]]

    def cpu_s(self, command: str) -> float:
        """Median CPU seconds of the command's processes (nan if it did not run)."""
        runs = self.timings.get(command, [])
        return statistics.median(t.cpu_s for t in runs) if runs else float("nan")

    def ratio(self, command: str) -> float:
        """Median over rounds of the command's CPU time / the bare process's of the same round."""
        pairs = zip(self.timings.get(command, []), self.timings.get("bare", []))
        ratios = [watched.cpu_s / bare.cpu_s for watched, bare in pairs]
        return statistics.median(ratios) if ratios else float("nan")


def commands(steps: int, out: Path) -> dict[str, list[str]]:
    """The argument vectors of :data:`COMMANDS`."""
    python, script = sys.executable, [str(SCRIPT), str(steps)]
    run = [python, "-m", "graphwatch", "run", "--out"]
    return {
        "bare": [python, *script],
        "default": [*run, str(out / "default"), *script],
        "light": [*run, str(out / "light"), "--level", "light", *script],
    }


def measure_process(rounds: int, steps: int, log: Log) -> ProcessResult:
    """Untimed warm-up runs, bare and default (the file cache, the bytecode), then ``rounds`` rotated rounds."""
    timings: dict[str, list[Timing]] = {name: [] for name in COMMANDS}
    with tempfile.TemporaryDirectory() as workdir:
        argvs, env = commands(steps, Path(workdir)), child_env(Path(workdir), cache=True)
        expected = time_process(argvs["bare"], env).printed
        _check("default", time_process(argvs["default"], env), expected)  # (light reads the same modules)
        for r in range(rounds):
            for name in COMMANDS[r % len(COMMANDS) :] + COMMANDS[: r % len(COMMANDS)]:
                timings[name].append(_check(name, time_process(argvs[name], env), expected))
            done = ", ".join(f"{name} {timings[name][-1].cpu_s:.2f}" for name in COMMANDS)
            log(f"  whole process, round {r + 1}/{rounds}: CPU s {done}")
    return ProcessResult(steps, timings)


def _check(name: str, timing: Timing, expected: str) -> Timing:
    """``timing``, if its process printed the bare run's parameter sums (its last line)."""
    last = timing.printed.strip().splitlines()[-1:]
    if last != expected.strip().splitlines()[-1:]:
        raise SystemExit(f"{name} printed {last}, the bare run {expected.strip()!r}: the script's result changed")
    return timing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="rounds of the three commands (default 7)")
    parser.add_argument("--steps", type=int, default=0, help="steps of the script (default workloads.SGD_STEPS)")
    args = parser.parse_args()
    import workloads

    result = measure_process(args.rounds, args.steps or workloads.SGD_STEPS, print)
    for name in COMMANDS:
        ratio = "" if name == "bare" else f", {result.ratio(name):.2f}x bare"
        print(f"{name}: {result.cpu_s(name):.2f} CPU s{ratio}")


if __name__ == "__main__":
    main()
