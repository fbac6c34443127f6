"""The tier bench's rounds: each round copies the checkpoint into every tier and restores
it from that tier alone, one tier after another; round r starts r tiers further along, so
no tier always follows the same neighbour (whose writeback might still be draining). One
warm-up round comes first and is not counted: it pays the first imports and connections.

Before a restore from a disk tier its files are fsynced and dropped from the page cache,
as after a node restart; how much of them was still cached is measured (bench.page_cache).
"""
from __future__ import annotations

import gc
from dataclasses import dataclass, field
from pathlib import Path

from bench.console import gb, progress
from bench.memory import settle
from bench.page_cache import evict, resident_fraction
from bench.tiers_sites import DISK_TIERS, TIERS, TierSites


@dataclass
class TierTimes:
    tier: str
    copy_s: list[float] = field(default_factory=list)
    fetch_verify_s: list[float] = field(default_factory=list)
    read_s: list[float] = field(default_factory=list)
    restore_s: list[float] = field(default_factory=list)
    """fetch_verify_s + read_s of the same round: the whole restore a resume waits for."""
    bytes: list[int] = field(default_factory=list)
    cached_after_copy: list[float] = field(default_factory=list)
    cached_at_restore: list[float] = field(default_factory=list)
    """Fractions of the copy's pages in the page cache (mincore); empty for the peer tier,
    whose copy is in the keeper's memory, not in files here."""


def round_order(index: int) -> tuple[str, ...]:
    shift = index % len(TIERS)
    return TIERS[shift:] + TIERS[:shift]


def run_rounds(sites: TierSites, source: Path, rounds: int) -> dict[str, TierTimes]:
    times = {tier: TierTimes(tier) for tier in TIERS}
    # As in bench.harness: frozen, the objects torch and DeepSpeed made are skipped by the
    # collection in `settle` before each restore, which then stays cheap.
    gc.freeze()
    try:
        for tier in round_order(0):
            one_tier(sites, source, tier, None, "warm-up (not counted)")
        for index in range(rounds):
            for tier in round_order(index):
                one_tier(sites, source, tier, times[tier], f"round {index + 1}/{rounds}")
    finally:
        gc.unfreeze()
    return times


def one_tier(sites: TierSites, source: Path, tier: str, times: TierTimes | None,
             where: str) -> None:
    """Copy into `tier`, make a restart's conditions, restore from it; record into `times`."""
    copy_s = sites.copy(tier, source)
    files = sites.copy_files(tier, source.name)
    after_copy = resident_fraction(files)
    if tier in DISK_TIERS:
        evict(files)
    at_restore = resident_fraction(files)
    nbytes = sites.held_bytes(tier, source.name)
    settle()  # the previous restore's garbage is not this one's to free
    restored = sites.restore(tier)
    cached = "" if at_restore is None else f", {at_restore:.0%} cached at restore"
    progress(f"{where} {tier}: copy {copy_s:.3f} s, restore {restored.total_s:.3f} s "
             f"(fetch+verify {restored.fetch_verify_s:.3f} s, read {restored.read_s:.3f} s), "
             f"{gb(nbytes)}{cached}")
    if times is None:
        return
    times.copy_s.append(copy_s)
    times.fetch_verify_s.append(restored.fetch_verify_s)
    times.read_s.append(restored.read_s)
    times.restore_s.append(restored.total_s)
    times.bytes.append(nbytes)
    if after_copy is not None:
        times.cached_after_copy.append(after_copy)
        times.cached_at_restore.append(at_restore)
