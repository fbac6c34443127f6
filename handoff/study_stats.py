"""Rank statistics for the checkpoint-selection study, with bootstrap intervals.

A study has K candidates (K >= 3, typically 6-8), so every statistic here is a rank
statistic computed exactly on small samples; numpy only, scipy is not a dependency.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

Stat = Callable[[Sequence[float], Sequence[float]], float]


def _paired(x: Sequence[float], y: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if a.ndim != 1 or a.shape != b.shape:
        raise ValueError(f"expected two 1-D sequences of equal length, got shapes "
                         f"{a.shape} and {b.shape}")
    return a, b


# Each statistic works on rows: (R, n) arrays hold R samples of n candidates, so a whole
# bootstrap is a few array operations. Pairwise comparisons cost O(n^2) per row, which
# is nothing at the K of a study and keeps ties exact.

def _rank_rows(a: np.ndarray) -> np.ndarray:
    """Average ranks per row, 1-based: (values below) + (values equal, itself included + 1) / 2."""
    below = (a[:, None, :] < a[:, :, None]).sum(-1)
    equal = (a[:, None, :] == a[:, :, None]).sum(-1)
    return below + (equal + 1) / 2.0


def _pearson_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    constant = (a.max(1) == a.min(1)) | (b.max(1) == b.min(1))
    da, db = a - a.mean(1, keepdims=True), b - b.mean(1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = (da * db).sum(1) / np.sqrt((da * da).sum(1) * (db * db).sum(1))
    return np.where(constant, np.nan, rho)


def _spearman_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.shape[1] < 2:
        return np.full(a.shape[0], np.nan)
    return _pearson_rows(_rank_rows(a), _rank_rows(b))


def _kendall_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    i, j = np.triu_indices(a.shape[1], k=1)
    sa, sb = np.sign(a[:, i] - a[:, j]), np.sign(b[:, i] - b[:, j])
    untied = np.count_nonzero(sa, axis=1) * np.count_nonzero(sb, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        tau = (sa * sb).sum(1) / np.sqrt(untied)
    return np.where(untied == 0, np.nan, tau)


def average_ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks; ties get their average rank ([10, 20, 20, 30] -> [1, 2.5, 2.5, 4])."""
    return _rank_rows(np.asarray(values, dtype=float)[None, :])[0].tolist()


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rho: Pearson correlation of average ranks; NaN when a side is constant."""
    a, b = _paired(x, y)
    return float(_spearman_rows(a[None, :], b[None, :])[0])


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b: (concordant - discordant) / sqrt((n0 - tx) (n0 - ty)).

    n0 is the number of pairs, tx and ty the pairs tied in x and in y. NaN when either
    side has no untied pair (it is constant, or there are fewer than two points).
    """
    a, b = _paired(x, y)
    return float(_kendall_rows(a[None, :], b[None, :])[0])


_ROWS = {spearman: _spearman_rows, kendall_tau_b: _kendall_rows}
_CELLS_PER_CHUNK = 1 << 20  # bounds the (rows, n, n) comparison arrays of one chunk


def _resampled(a: np.ndarray, b: np.ndarray, draws: np.ndarray, stat: Stat) -> np.ndarray:
    rows = _ROWS.get(stat)
    if rows is None:  # any other statistic: one call per resample
        return np.array([stat(a[d], b[d]) for d in draws], dtype=float)
    chunk = max(1, _CELLS_PER_CHUNK // (a.size * a.size))
    return np.concatenate([rows(a[draws[k:k + chunk]], b[draws[k:k + chunk]])
                           for k in range(0, len(draws), chunk)])


def bootstrap_ci(x: Sequence[float], y: Sequence[float], stat: Stat, *, resamples: int = 2000,
                 seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of `stat(x, y)`, resampling candidates as pairs.

    A resample that draws a constant side has an undefined statistic and is dropped;
    when fewer than half the resamples are defined the interval is (nan, nan): with so
    few distinct candidates there is nothing to report.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level={level}: expected a confidence level strictly between 0 and 1")
    if resamples < 1:
        raise ValueError(f"resamples={resamples}: expected at least 1")
    a, b = _paired(x, y)
    if len(a) == 0:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(a), size=(resamples, len(a)))
    values = _resampled(a, b, draws, stat)
    defined = values[~np.isnan(values)]
    if 2 * len(defined) < resamples:
        return math.nan, math.nan
    tail = 100.0 * (1.0 - level) / 2.0
    lo, hi = np.percentile(defined, [tail, 100.0 - tail])
    return float(lo), float(hi)
