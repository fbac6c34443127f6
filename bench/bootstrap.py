"""How far one run's throughput ratio can be trusted: a bootstrap interval over its rounds.

A checkpoint-every-step run times blocks of steps in rounds (ckpt every step, without,
the bound, the I/O floor), and on a shared 2-core VM one block moves by ±15% from one
round to the next. So the ratio of two sums says little alone: twelve rounds leave it a
few percent either way, as wide as the 3% a save every step may cost. Each round pairs
its block without saves with its block with them (run next to each other, so a slow
minute slows both); resampling whole rounds with replacement and taking the ratio of the
sums each time gives the percentile interval the report prints beside the ratio.
"""
from __future__ import annotations

import random

RESAMPLES = 2000
LEVEL = 0.95
SEED = 0
"""Fixed: the same rounds give the same interval, run after run."""


def ratio_interval(without: list[float], with_kind: list[float], level: float = LEVEL,
                   resamples: int = RESAMPLES) -> list[float]:
    """[low, high]: the `level` percentile interval of sum(without) / sum(with_kind) over
    rounds resampled with replacement (both lists: seconds per round, paired by index)."""
    if len(without) != len(with_kind) or not without:
        raise ValueError(f"paired rounds expected, got {len(without)} and {len(with_kind)}")
    draw = random.Random(SEED)
    rounds = range(len(without))
    ratios = []
    for _ in range(resamples):
        picked = [draw.choice(rounds) for _ in rounds]
        ratios.append(sum(without[i] for i in picked) / sum(with_kind[i] for i in picked))
    ratios.sort()
    tail = (1.0 - level) / 2
    return [ratios[int(tail * (resamples - 1))], ratios[int((1.0 - tail) * (resamples - 1))]]
