"""What ``import graphwatch`` and ``graphwatch run`` cost a short script (issue 41), in fresh processes.

Four commands, timed interleaved in one run (round r runs them in an order rotated by r, so drift on a shared
machine hits every command alike), each a fresh interpreter:

- ``python -c "import torch"`` vs ``python -c "import torch, graphwatch"``: what graphwatch adds to torch
  (the second also times its ``import graphwatch`` from the inside, after torch: the same cost without the
  noise of torch's own import, the steadier figure on a busy machine);
- ``python empty.py`` vs ``python -m graphwatch run empty.py``: what watching a near-empty script
  (``print(1)``) costs, report included; also against ``import torch``, what the run adds beyond torch.

Each process finds compiled bytecode, as an installed package's do: the children run without
``PYTHONDONTWRITEBYTECODE`` and keep their ``.pyc`` files under a temporary ``PYTHONPYCACHEPREFIX`` (nothing is
written into the checkout), filled by a warm-up round.  ``--no-cache`` keeps the environment as it is instead
(with ``PYTHONDONTWRITEBYTECODE=1`` and no ``__pycache__`` beside the sources, every process compiles them).
To time another checkout's graphwatch (a ``git archive`` of an earlier commit), set ``PYTHONPATH=ITS/src``.

Each command is timed twice: wall time (what the user waits) and the process's CPU time (user + system, read
off ``os.wait4``: steadier on a busy machine).  Printed: the median of each over the rounds, and per pair the
median of the paired differences (seconds) and ratios (round by round, the pair's two commands of the same round).

    .venv/bin/python benchmarks/import_cost.py --rounds 15
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

PAIRS = (
    ("import torch", "import torch, graphwatch"),
    ("empty.py", "graphwatch run empty.py"),
    ("import torch", "graphwatch run empty.py"),  # what the run adds beyond the torch it needs
)
# ``import torch, graphwatch``, timing its own ``import graphwatch`` (wall, CPU) after torch's
TIMED_IMPORT = (
    "import time, torch\n"
    "wall, cpu = time.perf_counter(), time.process_time()\n"
    "import graphwatch\n"
    "print(time.perf_counter() - wall, time.process_time() - cpu)"
)


@dataclass(frozen=True)
class Timing:
    """One fresh process: wall seconds, CPU seconds (user + system), and what it printed."""

    wall_s: float
    cpu_s: float
    printed: str


def commands(script: Path, out: Path) -> dict[str, list[str]]:
    """The four commands, by the names :data:`PAIRS` uses."""
    python = sys.executable
    return {
        "import torch": [python, "-c", "import torch"],
        "import torch, graphwatch": [python, "-c", TIMED_IMPORT],
        "empty.py": [python, str(script)],
        "graphwatch run empty.py": [python, "-m", "graphwatch", "run", "--out", str(out), str(script)],
    }


def child_env(workdir: Path, cache: bool) -> dict[str, str]:
    """The children's environment: this one, with a bytecode cache in ``workdir`` unless not ``cache``."""
    env = dict(os.environ)
    if cache:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(workdir / "pycache")
    return env


def time_process(argv: list[str], env: dict[str, str]) -> Timing:
    """Run ``argv`` to the end (stderr discarded); its wall time, its own CPU time and its output."""
    start = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    assert process.stdout is not None
    printed = process.stdout.read()  # (to the end, so that the process ends; then reaped here, with its usage)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {process.returncode}")
    return Timing(wall, usage.ru_utime + usage.ru_stime, printed)


def measure(rounds: int, workdir: Path, cache: bool) -> dict[str, list[Timing]]:
    """``rounds`` rounds of every command, the order rotated by one each round; one warm-up round first."""
    script = workdir / "empty.py"
    script.write_text("print(1)\n")
    argvs = commands(script, workdir / "report")
    env = child_env(workdir, cache)
    names = list(argvs)
    for name in names:  # warm-up: the file cache, the .pyc files
        time_process(argvs[name], env)
    timings: dict[str, list[Timing]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            timings[name].append(time_process(argvs[name], env))
    return timings


def report(timings: dict[str, list[Timing]]) -> str:
    """Medians per command, per pair the median paired difference and ratio (wall and CPU), then the import of
    graphwatch timed inside the process."""
    lines = ["| command | wall s (median) | CPU s (median) |", "| --- | --- | --- |"]
    for name, runs in timings.items():
        wall = statistics.median(t.wall_s for t in runs)
        cpu = statistics.median(t.cpu_s for t in runs)
        lines.append(f"| `{name}` | {wall:.3f} | {cpu:.3f} |")
    lines += ["", "| added by | wall +s | wall ratio | CPU +s | CPU ratio |", "| --- | --- | --- | --- | --- |"]
    for base, other in PAIRS:
        cells = []
        for field in ("wall_s", "cpu_s"):
            pairs = [(getattr(a, field), getattr(b, field)) for a, b in zip(timings[base], timings[other])]
            cells.append(f"{statistics.median(b - a for a, b in pairs):+.3f}")
            cells.append(f"{statistics.median(b / a for a, b in pairs):.2f}x")
        lines.append(f"| `{other}` vs `{base}` | " + " | ".join(cells) + " |")
    inside = [tuple(map(float, t.printed.split())) for t in timings["import torch, graphwatch"]]
    wall, cpu = (statistics.median(values) for values in zip(*inside))
    lines += ["", f"`import graphwatch` after `import torch`, timed inside the process: {wall:.3f} s wall, "
              f"{cpu:.3f} s CPU (medians)"]  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=11, help="rounds of the four commands (default 11)")
    parser.add_argument("--no-cache", action="store_true", help="no bytecode cache: the environment as it is")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        timings = measure(args.rounds, Path(workdir), cache=not args.no_cache)
    cache = "environment as is" if args.no_cache else "bytecode cached"
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    print(f"{args.rounds} rounds, {sys.executable}, {cache}, OMP_NUM_THREADS={threads}\n")
    print(report(timings))


if __name__ == "__main__":
    main()
