"""An append-only journal of steps: `<root>/step-000007/` holds one optimizer step.

Each segment is committed like a checkpoint: written into a hidden `.step-N.tmp`, files
fsynced, `manifest.json` (sizes and sha256) written last, then renamed into place, so a
crash leaves either the whole segment or none of it. A committed step is never
rewritten. Readers check every byte against the manifest before parsing anything, and
parse only JSON and safetensors (never pickle): a damaged journal is refused, not
replayed. Storage only; what the records mean is the caller's business.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from safetensors import SafetensorError

from ckpt.commit import fsync_dir
from core.errors import BatonError

if TYPE_CHECKING:  # torch loads where tensors are written or read: `baton ckpt verify`
    import torch     # of a journal checks bytes only, and starts in a second less

log = logging.getLogger(__name__)

SEGMENT_FORMAT = "baton.journal-segment/1"
RECORDS = "records.json"
TENSORS = "tensors.safetensors"
MANIFEST = "manifest.json"
# The only names a manifest may list: anything else could point outside the segment.
FILES = (RECORDS, TENSORS)
# Exactly what segment_name writes: `step-0000007` is not step 7's segment.
_SEGMENT = re.compile(r"^step-(\d{6}|[1-9]\d{6,})$")
_FIX = ("a damaged journal is never replayed: restore the segment from a copy, or resume "
        "from a checkpoint at or after this step")


class JournalError(BatonError):
    def __init__(self, path, message: str):
        self.path = str(path)
        super().__init__(f"{self.path}: {message}")


class JournalDamaged(JournalError):
    """A segment that is missing, uncommitted or differs from its manifest."""

    def __init__(self, path, problem: str):
        self.problem = problem
        super().__init__(path, f"journal is damaged: {problem}; {_FIX}")


class JournalSegmentExists(JournalError):
    """A write to a step the journal already holds."""

    def __init__(self, path, step: int):
        self.step = step
        super().__init__(path, (
            f"step {step} is already committed; the journal is append-only and a committed "
            "step is never rewritten, so nothing was written. Continue from the step after "
            "the journal's last committed one, or write to a new journal directory"))


def segment_name(step: int) -> str:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"a journal step is a non-negative int, got {step!r}")
    return f"step-{step:06d}"


def segment_dir(root: Path, step: int) -> Path:
    return Path(root) / segment_name(step)


def write_segment(root: Path, step: int, records: dict, tensors: dict) -> Path:
    """Commit one step atomically; return its directory."""
    from safetensors.torch import save as save_tensors

    root = Path(root)
    final = segment_dir(root, step)
    if (final / MANIFEST).is_file():
        raise JournalSegmentExists(final, step)
    root.mkdir(parents=True, exist_ok=True)
    staging = _fresh_staging(root, final)
    payloads = {
        RECORDS: json.dumps(records, sort_keys=True).encode(),
        TENSORS: save_tensors({key: _owned(t) for key, t in tensors.items()}),
    }
    for name, data in payloads.items():
        _write_synced(staging / name, data)
    manifest = {"format": SEGMENT_FORMAT, "step": step, "files": {
        name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        for name, data in payloads.items()}}
    _write_synced(staging / MANIFEST, json.dumps(manifest, sort_keys=True).encode())
    fsync_dir(staging)
    os.rename(staging, final)
    fsync_dir(root)
    return final


def read_segment(root: Path, step: int) -> tuple[dict, dict[str, torch.Tensor]]:
    """The records and tensors of a committed step, checked against its manifest first."""
    seg = segment_dir(root, step)
    data = _verified_files(seg, step)
    return _parse_records(seg, data[RECORDS]), _parse_tensors(seg, data[TENSORS])


def is_committed(root: Path, step: int) -> bool:
    """The segment of `step` has its manifest (written last: the commit marker)."""
    return (segment_dir(root, step) / MANIFEST).is_file()


def committed_steps(root: Path) -> list[int]:
    """Steps whose segment has its manifest; staging dirs and anything else are ignored."""
    root = Path(root)
    if not root.is_dir():
        return []
    steps = []
    for entry in root.iterdir():
        match = _SEGMENT.match(entry.name)
        if match and (entry / MANIFEST).is_file():
            steps.append(int(match.group(1)))
    return sorted(steps)


def verify(root: Path, first: int, last: int) -> list[int]:
    """Check that steps first..last are all committed and intact; return them."""
    wanted = list(range(first, last + 1))
    have = committed_steps(root)
    present = set(have)
    for step in wanted:
        if step not in present:
            raise JournalDamaged(segment_dir(root, step),
                                 f"step {step} is missing: the journal has steps {_spans(have)}")
    for step in wanted:
        _verified_files(segment_dir(root, step), step)
    return wanted


def _owned(tensor: torch.Tensor) -> torch.Tensor:
    import torch

    # A copy, not .contiguous() alone: views of one batch (tokens and a slice of them)
    # share storage, which safetensors refuses to save.
    return tensor.detach().to("cpu").clone(memory_format=torch.contiguous_format)


def _fresh_staging(root: Path, final: Path) -> Path:
    """An empty `.step-N.tmp`; what an interrupted write of this step left is removed."""
    staging = root / f".{final.name}.tmp"
    # `final` here lacks its manifest, so it was never committed: not journal data.
    for leftover in (staging, final):
        if leftover.exists():
            log.warning("removing %s left by an interrupted journal write", leftover)
            shutil.rmtree(leftover)
    staging.mkdir()
    return staging


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _verified_files(seg: Path, step: int) -> dict[str, bytes]:
    entries = _manifest_files(seg, step)
    return {name: _checked_bytes(seg, name, entries[name]) for name in FILES}


def _manifest_files(seg: Path, step: int) -> dict:
    path = seg / MANIFEST
    if not path.is_file():
        raise JournalDamaged(seg, f"{MANIFEST} is missing: step {step} was never committed")
    try:
        manifest = json.loads(path.read_bytes())
    except ValueError as exc:
        raise JournalDamaged(seg, f"{MANIFEST} is not valid JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise JournalDamaged(seg, f"{MANIFEST} holds a {type(manifest).__name__}, "
                                  "expected an object")
    if manifest.get("format") != SEGMENT_FORMAT:
        found = manifest.get("format")
        raise JournalDamaged(seg, f"{MANIFEST} has format {found!r}, expected {SEGMENT_FORMAT!r}")
    if manifest.get("step") != step:
        raise JournalDamaged(seg, f"{MANIFEST} is for step {manifest.get('step')!r}, "
                                  f"expected step {step}")
    return _confined(seg, manifest.get("files"))


def _confined(seg: Path, files: object) -> dict:
    """Only the two known plain names: a listed path is never followed before it is vetted."""
    names = sorted(files) if isinstance(files, dict) else files
    if not isinstance(files, dict) or names != sorted(FILES):
        raise JournalDamaged(seg, f"{MANIFEST} lists files {names!r}, expected exactly "
                                  f"{sorted(FILES)}; nothing was read")
    for name, entry in files.items():
        if not (isinstance(entry, dict) and isinstance(entry.get("size"), int)
                and isinstance(entry.get("sha256"), str)):
            raise JournalDamaged(seg, f"{MANIFEST} entry for {name} is {entry!r}, "
                                      "expected {'size': int, 'sha256': str}")
    return files


def _checked_bytes(seg: Path, name: str, entry: dict) -> bytes:
    """The file's bytes, read once, after its size and sha256 match the manifest."""
    path = seg / name
    if path.is_symlink() or not path.is_file():
        what = "a symlink" if path.is_symlink() else "missing"
        raise JournalDamaged(seg, f"{name} is {what}, expected the file the manifest lists")
    data = path.read_bytes()
    if len(data) != entry["size"]:
        raise JournalDamaged(seg, f"{name} size is {len(data)} bytes, expected {entry['size']}")
    found = hashlib.sha256(data).hexdigest()
    if found != entry["sha256"]:
        raise JournalDamaged(seg, f"{name} sha256 is {found}, expected {entry['sha256']}")
    return data


def _parse_records(seg: Path, data: bytes) -> dict:
    try:
        records = json.loads(data)
    except ValueError as exc:
        raise JournalDamaged(seg, f"{RECORDS} is not valid JSON ({exc})") from None
    if not isinstance(records, dict):
        raise JournalDamaged(seg, f"{RECORDS} holds a {type(records).__name__}, expected an object")
    return records


def _parse_tensors(seg: Path, data: bytes) -> dict[str, torch.Tensor]:
    from safetensors.torch import load as load_tensors

    try:
        return load_tensors(data)
    except SafetensorError as exc:
        raise JournalDamaged(seg, f"{TENSORS} is not a safetensors file ({exc})") from None


def _spans(steps: list[int]) -> str:
    """`[1-4, 6, 9-12]`: a long journal's steps in a message of readable length."""
    spans: list[list[int]] = []
    for step in steps:
        if spans and step == spans[-1][1] + 1:
            spans[-1][1] = step
        else:
            spans.append([step, step])
    return "[" + ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans) + "]"
