"""Atomic commit: `step-N.tmp/` -> fsync -> manifest (last) -> rename -> move `latest`.

Rank 0 runs these once every rank has written its files. A crash at any point
leaves either the previous `latest` or the new one, never a half checkpoint.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from ckpt import manifest as manifest_io
from ckpt.layout import (DELETING_SUFFIX, LATEST, MANIFEST, TMP_SUFFIX, committed_steps,
                         read_latest)
from ckpt.retention import KeepBest, best, pinned

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


def fresh_staging(destination: Path, suffix: str, refuse) -> Path:
    """An empty hidden `.<name><suffix>` beside `destination`, for a directory written
    whole and renamed into place (adopt, export). A leftover of an interrupted attempt is
    removed first; `refuse(reason)` builds the error raised when it cannot be created."""
    staging = destination.with_name(f".{destination.name}{suffix}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir(parents=True)
    except OSError as exc:
        raise refuse(exc.strerror or str(exc)) from None
    return staging


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def final_dir(tmp: Path) -> Path:
    return tmp.with_name(tmp.name[: -len(TMP_SUFFIX)])


def commit(tmp: Path, manifest: manifest_io.Manifest) -> Path:
    """Write the manifest last, rename into place, then move `latest`. Returns the final dir."""
    manifest_io.write(tmp, manifest)
    fsync_dir(tmp)
    final = final_dir(tmp)
    if final.exists():
        # Re-saving a step (e.g. a resumed run reaching a step saved before): replace it
        # only after the new one is complete, and never leave `latest` naming it while it
        # is gone: point `latest` at the newest other checkpoint (or none) first.
        if read_latest(final.parent) == final:
            step_back_latest(final)
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


def step_back_latest(leaving: Path) -> None:
    """Point `latest` at the newest committed checkpoint other than `leaving`; remove the
    pointer when there is none (no `latest` is better than one naming nothing)."""
    others = [p for p in committed_steps(leaving.parent) if p != leaving]
    if others:
        point_latest(others[-1])
    else:
        (leaving.parent / LATEST).unlink(missing_ok=True)
        fsync_dir(leaving.parent)


def apply_retention(root: Path, keep_last: int, deferred: list[Path] | None = None,
                    keep_best: KeepBest | None = None) -> list[Path]:
    """Delete the committed checkpoints that are neither among the newest `keep_last`, nor
    the best `keep_best` by its metric, nor pinned (ckpt.retention); never the newest or
    `latest`. `deferred`: see `discard`."""
    steps = committed_steps(root)
    latest = read_latest(root)
    keep = set(steps[-max(keep_last, 1):]) | ({latest} if latest else set()) | pinned(root)
    if keep_best is not None:
        keep |= best(steps, keep_best)
    # A kept checkpoint saved selectively uses files of earlier ones: those stay too.
    keep |= {root / name for path in keep for name in referenced_checkpoints(path)}
    removed = [p for p in steps if p not in keep]
    for path in removed:
        discard(path, deferred)
    return removed


def referenced_checkpoints(path: Path) -> set[str]:
    """Names of the checkpoints whose files `path`'s manifest references (ckpt.selective).
    A manifest that cannot be read references nothing here; verify names its problem."""
    try:
        references = json.loads((path / MANIFEST).read_bytes()).get("references") or {}
        return {str(entry["checkpoint"]) for entry in references.values()}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return set()


def discard(path: Path, deferred: list[Path] | None = None) -> None:
    """Delete a checkpoint directory without ever leaving a `step-N` that lacks files:
    rename it out of the step namespace first (atomic), then delete. A kill mid-delete
    leaves `step-N.deleting`, which the next save or `baton ckpt gc` removes.

    With `deferred`, the renamed directory is appended to it instead of deleted: freeing a
    gigabyte takes a fifth of a second here, and a save's commit need not wait for it."""
    doomed = path.with_name(path.name + DELETING_SUFFIX)
    if doomed.exists():
        shutil.rmtree(doomed)
    os.rename(path, doomed)
    fsync_dir(path.parent)
    if deferred is not None:
        deferred.append(doomed)
        return
    shutil.rmtree(doomed, ignore_errors=True)
