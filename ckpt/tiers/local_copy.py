"""Copy a committed checkpoint into another checkpoints directory with the same commit
protocol: files into `step-N.tmp/`, the manifest's own bytes last, rename, `latest`,
retention. A copy cut short leaves a `.tmp`, never a checkpoint."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from ckpt import commit as commit_io
from ckpt.layout import MANIFEST, read_latest
from ckpt.tiers.shipment import Shipment, shipment_of


def copy_committed(source: Path | Shipment, root: Path, keep: int) -> Path:
    """`source`: a committed checkpoint directory, or what to copy of one (a shipment)."""
    shipment = source if isinstance(source, Shipment) else shipment_of(source)
    root.mkdir(parents=True, exist_ok=True)
    tmp = commit_io.clear_stale_tmp(root, shipment.name)
    tmp.mkdir()
    for rel, path in shipment.files:
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        _durable_copy(path, tmp / rel)
    with open(tmp / MANIFEST, "wb") as handle:  # last
        handle.write(shipment.manifest)
        os.fsync(handle.fileno())
    for directory in sorted({p.parent for p in tmp.rglob("*")} | {tmp}, reverse=True):
        commit_io.fsync_dir(directory)
    return place(tmp, root, keep)


def _durable_copy(source: Path, target: Path) -> None:
    """On a disk, the copy is durable before the manifest names it (on a tmpfs, fsync
    returns at once)."""
    shutil.copyfile(source, target)
    with open(target, "rb") as handle:
        os.fsync(handle.fileno())


def place(tmp: Path, root: Path, keep: int) -> Path:
    """Rename a complete `tmp` (manifest included) into place, move `latest`, retain `keep`."""
    final = commit_io.final_dir(tmp)
    if final.exists():
        if read_latest(root) == final:
            commit_io.step_back_latest(final)
        commit_io.discard(final)
    tmp.rename(final)
    commit_io.fsync_dir(root)
    commit_io.point_latest(final)
    commit_io.apply_retention(root, keep)
    return final
