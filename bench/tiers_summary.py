"""The tier bench's numbers: min and median per tier, and every ratio computed here from
those numbers alone, named `<tier>_over_memory_<min|median>` (restore time) and
`copy_<tier>_over_memory_<min|median>` (copy time); mins divide mins, medians medians."""
from __future__ import annotations

import statistics

from ckpt.tiers.plan import MEMORY

from bench.tiers_rounds import TierTimes
from bench.tiers_sites import DISK_TIERS

STATS = (("min", min), ("median", statistics.median))
TIMES = ("restore_s", "fetch_verify_s", "read_s", "copy_s")


def page_cache(times: TierTimes) -> dict:
    """What was in memory when each restore started, measured rather than assumed."""
    if not times.cached_at_restore:
        return {"evicted": False, "resident_after_copy_min": None,
                "resident_at_restore_max": None,
                "note": "the copy lives in the keeper process's memory, not in files here"}
    evicted = times.tier in DISK_TIERS
    return {"evicted": evicted, "resident_after_copy_min": min(times.cached_after_copy),
            "resident_at_restore_max": max(times.cached_at_restore),
            "note": ("fsync + POSIX_FADV_DONTNEED on every file before each restore; "
                     "residency by mincore") if evicted else
                    "a tmpfs: its pages are memory and stay there by nature"}


def tier_row(times: TierTimes) -> dict:
    row: dict = {"tier": times.tier, "rounds": len(times.restore_s),
                 "bytes": int(statistics.median(times.bytes))}
    for key in TIMES:
        values = getattr(times, key)
        for stat, pick in STATS:
            row[f"{key}_{stat}"] = pick(values)
    row["page_cache"] = page_cache(times)
    return row


def ratios(rows: list[dict]) -> dict:
    by_tier = {row["tier"]: row for row in rows}
    memory = by_tier[MEMORY]
    found: dict = {}
    for tier, row in by_tier.items():
        if tier == MEMORY:
            continue
        for stat, _ in STATS:
            found[f"{tier}_over_memory_{stat}"] = row[f"restore_s_{stat}"] / memory[f"restore_s_{stat}"]
            found[f"copy_{tier}_over_memory_{stat}"] = row[f"copy_s_{stat}"] / memory[f"copy_s_{stat}"]
    return found


def summarize(times: dict[str, TierTimes]) -> tuple[list[dict], dict]:
    """(tier rows, ratios)"""
    rows = [tier_row(t) for t in times.values()]
    return rows, ratios(rows)
