"""The tier bench's table on stdout, and the lines that say under which conditions each
tier was read."""
from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

from bench.report import WIDE, pair, seconds, times

COLUMNS = ("tier", "restore s", "fetch+verify s", "read s", "copy s", "GB",
           "restore ÷ memory", "copy ÷ memory", "cached at restore")


def cached(row: dict) -> str:
    cache = row["page_cache"]
    resident = cache["resident_at_restore_max"]
    if resident is None:
        return "- (keeper memory)"
    return f"≤ {resident:.0%}" + (" after fadvise" if cache["evicted"] else " (tmpfs)")


def ratio_cell(ratios: dict, key: str) -> str:
    """min/median of one ratio; the memory tier's own row has none (it is the denominator)."""
    return pair(ratios, key, times) if f"{key}_min" in ratios else "-"


def tiers_table(result: dict) -> Table:
    table = Table(title=f"Restore from each tier alone, checkpoint {result['checkpoint']} "
                  f"({result['checkpoint_bytes'] / 1e9:.3g} GB, {result['files']} files), "
                  f"min/median of {result['rounds']} interleaved rounds")
    for column in COLUMNS:
        table.add_column(column, justify="left" if column == "tier" else "right", no_wrap=True)
    for row in result["tiers"]:
        tier = row["tier"]
        table.add_row(tier, pair(row, "restore_s"), pair(row, "fetch_verify_s"),
                      pair(row, "read_s"), pair(row, "copy_s"), f"{row['bytes'] / 1e9:.3g}",
                      ratio_cell(result["ratios"], f"{tier}_over_memory"),
                      ratio_cell(result["ratios"], f"copy_{tier}_over_memory"), cached(row))
    return table


def condition_lines(result: dict) -> list[str]:
    keeper = result["keeper"]
    return [
        "restore = ckpt.tiers.restore.restore() with a plan offering that tier alone (list, "
        "fetch a peer or remote copy, verify every checksum) + every file read once, checked "
        "and deserialized, as a resume reads it",
        "copy = ckpt.tiers.replicate of the committed checkpoint into that tier, as training "
        "places it after a save",
        "persistent, remote: every file fsynced and dropped with POSIX_FADV_DONTNEED before "
        "each restore; 'cached at restore' is the most mincore still found resident",
        f"peer: a `baton ckpt keeper` process (pid {keeper['pid']}) on {keeper['endpoint']}: "
        "loopback TCP on this machine, no network between nodes",
        f"remote: a file:// URL on the file system at {result['machine']['filesystem']['mount']} "
        "(the run directory's)",
        f"the checkpoint: one baton sync save of a {result['state_bytes'] / 1e9:.3g} GB state "
        f"({result['params']:,} parameters), {seconds(result['save_s'])} s",
    ]


def print_tier_report(result: dict) -> None:
    console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else WIDE)
    console.print(tiers_table(result))
    for line in condition_lines(result):
        console.print(line, highlight=False)
