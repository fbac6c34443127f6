"""Atomic commit: `step-N.tmp/` -> fsync -> manifest (last) -> rename -> move `latest`.

Rank 0 runs these once every rank has written its files. A crash at any point
leaves either the previous `latest` or the new one, never a half checkpoint.
"""
from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from ckpt import manifest as manifest_io
from ckpt.layout import DELETING_SUFFIX, LATEST, TMP_SUFFIX, committed_steps, read_latest

log = logging.getLogger(__name__)


def tmp_dir(root: Path, name: str) -> Path:
    return root / (name + TMP_SUFFIX)


def clear_stale_tmp(root: Path, name: str) -> Path:
    """Remove a `.tmp` left by an interrupted save of the same checkpoint; return the tmp path."""
    tmp = tmp_dir(root, name)
    if tmp.exists():
        log.warning("removing %s left by an interrupted save", tmp)
        shutil.rmtree(tmp)
    return tmp


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(tmp: Path, manifest: manifest_io.Manifest) -> Path:
    """Write the manifest last, rename into place, then move `latest`. Returns the final dir."""
    manifest_io.write(tmp, manifest)
    fsync_dir(tmp)
    final = tmp.with_name(tmp.name[: -len(TMP_SUFFIX)])
    if final.exists():
        # Re-saving a step (e.g. a resumed run reaching a step saved before): replace it
        # only after the new one is complete.
        discard(final)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    point_latest(final)
    return final


def point_latest(final: Path) -> None:
    pointer = final.parent / LATEST
    staging = final.parent / (LATEST + TMP_SUFFIX)
    staging.write_text(final.name)
    with open(staging) as handle:
        os.fsync(handle.fileno())
    os.replace(staging, pointer)
    fsync_dir(final.parent)


def apply_retention(root: Path, keep_last: int) -> list[Path]:
    """Delete the oldest committed checkpoints beyond `keep_last`; never the newest or `latest`."""
    steps = committed_steps(root)
    latest = read_latest(root)
    keep = set(steps[-max(keep_last, 1):]) | ({latest} if latest else set())
    removed = [p for p in steps if p not in keep]
    for path in removed:
        discard(path)
    return removed


def discard(path: Path) -> None:
    """Delete a checkpoint directory without ever leaving a `step-N` that lacks files:
    rename it out of the step namespace first (atomic), then delete. A kill mid-delete
    leaves `step-N.deleting`, which the next save or `baton ckpt gc` removes."""
    doomed = path.with_name(path.name + DELETING_SUFFIX)
    if doomed.exists():
        shutil.rmtree(doomed)
    os.rename(path, doomed)
    fsync_dir(path.parent)
    shutil.rmtree(doomed, ignore_errors=True)
