"""Peak memory and time of one backward through a long chain, bare and under graphwatch (issue 16, item 7).

Each configuration runs in a fresh process (peak RSS is per process): build ``h = tanh(h @ w)`` until the
graph has ``--nodes`` nodes, backward once, and report the process's peak RSS (``ru_maxrss``) and the CPU
seconds of forward and backward.  Target: graphwatch's peak at most 1.5x bare's.

    .venv/bin/python benchmarks/deep_memory.py --nodes 1000000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

TARGET = 1.5

_CHILD = r"""
import json, resource, sys, time
import torch
nodes, config = int(sys.argv[1]), sys.argv[2]
torch.manual_seed(0)
w = torch.nn.Parameter(torch.randn(8, 8) * 0.3)
h = torch.randn(1, 8)
if config != "bare":
    import graphwatch
    session = graphwatch.watch(summary=False, level=config)
    session.__enter__()
started = time.process_time()
for _ in range((nodes - 1) // 2):  # mm + tanh a time step, plus the final sum
    h = torch.tanh(h @ w)
loss = h.sum()
forward = time.process_time() - started
del h
started = time.process_time()
loss.backward()
backward = time.process_time() - started
del loss
if config != "bare":
    session.__exit__(None, None, None)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"peak": peak, "forward": forward, "backward": backward}))
"""


def measure(nodes: int, config: str) -> dict[str, float]:
    """Peak RSS bytes and CPU seconds of forward and backward of one fresh process."""
    repo = str(Path(__file__).resolve().parent.parent / "src")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(nodes), config], capture_output=True, text=True, env=env, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{config}: exit {done.returncode}\n{done.stderr[-2000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--configs", default="bare,light,default")
    args = parser.parse_args()
    results = {config: measure(args.nodes, config) for config in args.configs.split(",")}
    bare = results.get("bare")
    print(f"{args.nodes:,} nodes, one backward")
    print("| configuration | peak RSS | / bare | forward CPU s | backward CPU s | / bare (both) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for config, r in results.items():
        peak = f"{r['peak'] / 2**30:.2f} GB"
        ratio = f"{r['peak'] / bare['peak']:.2f}x" if bare else "-"
        seconds = r["forward"] + r["backward"]
        time_ratio = f"{seconds / (bare['forward'] + bare['backward']):.2f}x" if bare else "-"
        print(f"| {config} | {peak} | {ratio} | {r['forward']:.1f} | {r['backward']:.1f} | {time_ratio} |")
    if bare and "default" in results:
        ratio = results["default"]["peak"] / bare["peak"]
        print(f"target: default peak <= {TARGET}x bare: {'met' if ratio <= TARGET else 'MISSED'} ({ratio:.2f}x)")


if __name__ == "__main__":
    main()
