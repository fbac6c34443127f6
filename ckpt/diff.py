"""Compare two checkpoints component by component, tensor by tensor.

Every file is read once and checked against its manifest before it is parsed
(ckpt.reader); pickles are loaded weights_only. `meta.json` (config,
argv, library versions) is reported but never makes checkpoints "different": a
resumed run legitimately records a different `resume=` than the straight one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ckpt import content_hash
from ckpt import manifest as manifest_io
from ckpt.checkpointer import META, classify
from ckpt.errors import CheckpointError, UnreadablePayload
from ckpt.reader import CheckpointReader

INFORMATIONAL = {META}


@dataclass
class FileDiff:
    file: str
    components: list[str]
    compared: int = 0
    max_abs_diff: float = 0.0
    first_difference: str | None = None
    identical: bool = True


@dataclass
class DiffReport:
    files: list[FileDiff] = field(default_factory=list)
    only_in_a: list[str] = field(default_factory=list)
    only_in_b: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.only_in_a and not self.only_in_b and all(f.identical for f in self.files)


def _flatten(value, prefix: str, out: dict) -> None:
    if isinstance(value, torch.Tensor):
        out[prefix] = value
    elif isinstance(value, dict):
        for key in value:
            _flatten(value[key], f"{prefix}.{key}" if prefix else str(key), out)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _flatten(item, f"{prefix}[{i}]", out)
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        _flatten(vars(value), f"{prefix}<{type(value).__name__}>", out)
    else:
        out[prefix] = value


def _load(reader: CheckpointReader, rel: str):
    """Read once, check against the manifest, then parse those bytes (pickles weights_only)."""
    return reader.load(rel)


def _read(reader: CheckpointReader, rel: str):
    """`_load`, with any failure to read the payload turned into "could not compare"
    (`UnreadablePayload`, exit 2) rather than a traceback or a verdict of "different"."""
    try:
        return _load(reader, rel)
    except CheckpointError:
        raise
    except Exception as exc:  # UnpicklingError, a torn zip, bad JSON or safetensors, I/O
        raise UnreadablePayload(reader.directory, rel, exc) from None


def _compare(a, b, diff: FileDiff, atol: float) -> None:
    flat_a, flat_b = {}, {}
    _flatten(a, "", flat_a)
    _flatten(b, "", flat_b)
    for key in sorted(set(flat_a) | set(flat_b)):
        diff.compared += 1
        va, vb = flat_a.get(key, "<absent>"), flat_b.get(key, "<absent>")
        if isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor):
            if va.shape != vb.shape or va.dtype != vb.dtype:
                same, delta = False, float("inf")
            elif va.is_floating_point():
                delta = float((va.detach() - vb.detach()).abs().max()) if va.numel() else 0.0
                same = delta <= atol and bool(torch.equal(va.isnan(), vb.isnan()))
            else:
                same, delta = bool(torch.equal(va, vb)), 0.0 if torch.equal(va, vb) else float("inf")
            diff.max_abs_diff = max(diff.max_abs_diff, delta)
        else:
            same = va == vb or (isinstance(va, float) and isinstance(vb, float) and abs(va - vb) <= atol)
        if not same:
            diff.identical = False
            diff.first_difference = diff.first_difference or key or "<value>"


def diff_checkpoints(a: str | Path, b: str | Path, atol: float = 0.0) -> DiffReport:
    a, b = Path(a), Path(b)
    ma, mb = manifest_io.verify(a), manifest_io.verify(b)
    ra, rb = CheckpointReader(a, ma), CheckpointReader(b, mb)
    report = DiffReport(only_in_a=sorted(set(ma.files) - set(mb.files)),
                        only_in_b=sorted(set(mb.files) - set(ma.files)))
    zero = ma.layout.zero_stage
    for rel in sorted(set(ma.files) & set(mb.files)):
        if rel.endswith(".py"):
            continue  # DeepSpeed's copied helper scripts, not state
        diff = FileDiff(rel, classify(rel, zero))
        if content_hash.identity(ma.files[rel]) == content_hash.identity(mb.files[rel]):
            diff.compared = 1
        else:
            _compare(_read(ra, rel), _read(rb, rel), diff, atol)
        if rel in INFORMATIONAL:
            if not diff.identical:
                report.notes.append(f"{rel} differs at {diff.first_difference} (informational)")
            continue
        report.files.append(diff)
    return report
