"""What interrupted saves and deletions leave in a checkpoints directory, and its removal.

A leftover is never a checkpoint (none has a committed manifest), only used space:

- `step-N.tmp/`: a save killed before its commit;
- `step-N.deleting/`: retention (or a re-save) killed mid-delete (ckpt.commit.discard);
- `step-N/` without manifest.json: left by a delete in place (baton before discard);
- `latest.tmp`: a pointer move killed before its rename.

A running save's `step-N.tmp` looks exactly like a dead one's, so only the directory's
owner may remove them: the saving rank 0 (its launcher holds the stage lock) before
each save, and `baton ckpt gc` while holding that lock itself.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ckpt.layout import DELETING_SUFFIX, LATEST, MANIFEST, TMP_SUFFIX, read_latest, step_of


@dataclass(frozen=True)
class Leftover:
    path: Path
    why: str


def find_leftovers(root: Path) -> list[Leftover]:
    root = Path(root)
    if not root.is_dir():
        return []
    latest = read_latest(root)
    found = []
    for path in sorted(root.iterdir()):
        why = _why_leftover(path)
        if why and path != latest:  # `latest` never names one; if it did, keep the evidence
            found.append(Leftover(path, why))
    return found


def _why_leftover(path: Path) -> str | None:
    name = path.name
    if name == LATEST + TMP_SUFFIX and not path.is_dir():
        return "a pointer move that never finished"
    if not path.is_dir():
        return None
    if name.endswith(TMP_SUFFIX) and step_of(name[: -len(TMP_SUFFIX)]) is not None:
        return "a save that never committed"
    if name.endswith(DELETING_SUFFIX) and step_of(name[: -len(DELETING_SUFFIX)]) is not None:
        return "a deletion that never finished"
    if step_of(name) is not None and not (path / MANIFEST).is_file():
        return "a step directory without a manifest"
    return None


def remove_leftovers(root: Path, keep: set[str] = frozenset()) -> list[Leftover]:
    """Remove every leftover under `root`; the caller must own the directory (see above).
    `keep`: names of this owner's own saves still in flight (asynchronous saving)."""
    removed = [left for left in find_leftovers(root) if left.path.name not in keep]
    for leftover in removed:
        if leftover.path.is_dir():
            shutil.rmtree(leftover.path, ignore_errors=True)
        else:
            leftover.path.unlink(missing_ok=True)
    if removed:
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return removed
