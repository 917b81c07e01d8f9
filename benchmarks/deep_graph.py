"""Deep graphs: how the cost per step scales from the 10k-node to the 100k-node unrolled RNN.

Both sizes are measured in the same rounds (one group, interleaved), so the
100k / 10k figure is a paired ratio.  They run under a low recursion limit
(see :func:`measure.recursion_limit`): any Python recursion proportional to
the graph fails at once.  graphwatch's own work on them (graph walk, step end)
comes from the session methods :mod:`measure` times.
"""

from __future__ import annotations

from measure import RoundResult, WorkloadResult, med


def scaling(small: WorkloadResult, big: WorkloadResult, config: str, added: bool = False, steady: bool = False) -> float:
    """Median over rounds of big/small ms/step (same round, same process).

    ``added``: of the cost over bare; ``steady``: of the steps after each round's first (the session's
    one-off snapshot and first records are in the first step).
    """
    ms = (lambda r: r.steady_ms) if steady else (lambda r: r.mean_ms)
    ratios = []
    for i, (s, b) in enumerate(zip(small.results.get(config, []), big.results.get(config, []))):
        if not added:
            ratios.append(ms(b) / ms(s))
            continue
        try:
            sb, bb = small.results["bare"][i], big.results["bare"][i]
        except (KeyError, IndexError):
            return float("nan")
        if ms(s) - ms(sb) < 0.05 * ms(sb):
            return float("nan")  # no added cost to scale (within noise)
        ratios.append((ms(b) - ms(bb)) / (ms(s) - ms(sb)))
    return med(ratios)


def worst_end_step(r: WorkloadResult) -> float:
    """Seconds of the slowest Session._end_step call under the default sessions (nan if none ran)."""
    return max(r.calls("gw", "end_step_s") + r.calls("gw_nosnap", "end_step_s"), default=float("nan"))


def walks_without_snapshot(r: WorkloadResult) -> list[float]:
    """Seconds of each graph walk before a backward, the snapshot taken inside it left out.

    From ``gw_nosnap`` (no snapshots) where it ran, else from ``gw``.
    """
    config = "gw_nosnap" if "gw_nosnap" in r.results else "gw"
    return [w - s for rr in r.results.get(config, []) for w, s in _walk_and_snapshot(rr)]


def _walk_and_snapshot(r: RoundResult) -> list[tuple[float, float]]:
    # snapshots happen inside walks; attribute them to the first walks in order
    snaps = list(r.snapshot_s)
    return [(w, snaps.pop(0) if snaps and snaps[0] <= w else 0.0) for w in r.walk_s]
