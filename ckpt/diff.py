"""Compare two checkpoints component by component, tensor by tensor.

Every file is read once and checked against its manifest before it is parsed
(ckpt.reader); pickles are loaded weights_only.

Two checkpoints are IDENTICAL when they hold the same training state: every state file,
and the manifest's stage, step, mid-accumulation flag and parallel layout. Where a
checkpoint lies and how it was made are not state, so they are reported as
informational notes and never make checkpoints "different": `meta.json` (config, argv,
paths, versions; a resumed run legitimately records another `resume=`), DeepSpeed's
copied `.py` scripts, and the manifest's `extra` (parent, `source`, `resharded_from`),
signature and hashing scheme. A reproduction in another run directory is IDENTICAL.

The report carries both checkpoints' content digests (ckpt.content_digest). Equal
digests mean the same state; unequal ones may still be IDENTICAL here: the same bytes
hashed under another scheme, values within --atol, or another distributed backend.
"""
from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ckpt import content_hash
from ckpt import manifest as manifest_io
from ckpt.state_files import META, classify
from ckpt.content_digest import content_digest, is_state_file
from ckpt.errors import CheckpointError, UnreadablePayload
from ckpt.reader import CheckpointReader

INFORMATIONAL = {META}
# The pseudo-file under which the manifest's training facts are compared.
MANIFEST_FACTS = manifest_io.MANIFEST
# Differing keys named in one note; the rest are counted.
NOTE_KEYS = 6


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
    """Informational differences: where and how each checkpoint was made, not what it holds."""
    content_digest_a: str = ""
    content_digest_b: str = ""
    environment: list[str] = field(default_factory=list)
    """How the two writers' environment fingerprints differ (core.fingerprint), likeliest
    cause of a numeric difference first: "CPU capability AVX2 → DEFAULT"."""

    @property
    def identical(self) -> bool:
        return not self.only_in_a and not self.only_in_b and all(f.identical for f in self.files)

    @property
    def same_content_digest(self) -> bool:
        return self.content_digest_a == self.content_digest_b


def _is_tensor(value) -> bool:
    # Nothing is a tensor before torch is loaded: two checkpoints with the same bytes, and
    # their JSON files, are compared without importing it (a second of `baton ckpt diff`).
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _flatten(value, prefix: str, out: dict) -> None:
    if _is_tensor(value):
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
        if _is_tensor(va) and _is_tensor(vb):
            import torch

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


def _differing_keys(a, b) -> list[str]:
    flat_a, flat_b = {}, {}
    _flatten(a, "", flat_a)
    _flatten(b, "", flat_b)
    return [key or "<value>" for key in sorted(set(flat_a) | set(flat_b))
            if flat_a.get(key, "<absent>") != flat_b.get(key, "<absent>")]


def _note(what: str, keys: list[str], why: str) -> str:
    named = ", ".join(keys[:NOTE_KEYS]) + (f" and {len(keys) - NOTE_KEYS} more"
                                           if len(keys) > NOTE_KEYS else "")
    return f"{what} differs at {named} (informational: {why})"


def _facts(manifest) -> dict:
    """What the manifest says about the state itself (part of the content digest)."""
    return {"stage": manifest.stage, "step": manifest.step,
            "mid_accumulation": manifest.mid_accumulation, "layout": asdict(manifest.layout)}


def _provenance(manifest) -> dict:
    """What the manifest says beyond the state: where the checkpoint came from, how it was
    hashed and signed, and parallel keys that are not the layout (the backend)."""
    layout_keys = set(asdict(manifest.layout)) | {"gradient_accumulation_steps"}
    return {"extra": manifest.extra, "signature": manifest.signature,
            "hashing": manifest.hashing, "format": manifest.format,
            "parallel": {k: v for k, v in manifest.parallel.items() if k not in layout_keys}}


def _compare_manifests(ma, mb, report: DiffReport) -> None:
    facts = FileDiff(MANIFEST_FACTS, ["stage/step/layout"])
    _compare(_facts(ma), _facts(mb), facts, atol=0.0)
    report.files.append(facts)
    keys = _differing_keys(_provenance(ma), _provenance(mb))
    if keys:
        report.notes.append(_note(MANIFEST_FACTS, keys, "provenance, hashing or signature, "
                                  "not what it holds"))


def _split_only_in(names: set[str], side: str, report: DiffReport) -> list[str]:
    """State files present on one side only; the others (DeepSpeed's `.py` scripts) become notes."""
    report.notes += [f"only in {side}: {rel} (informational: not training state)"
                     for rel in sorted(names) if not is_state_file(rel)]
    return sorted(rel for rel in names if is_state_file(rel))


def _environment_differences(info_a, info_b) -> list[str]:
    """The fingerprint differences of two meta.json files that both carry one."""
    env_a, env_b = (info.get("environment") if isinstance(info, dict) else None
                    for info in (info_a, info_b))
    if not env_a or not env_b:
        return []
    from core.fingerprint import differences
    return differences(env_a, env_b)


def diff_checkpoints(a: str | Path, b: str | Path, atol: float = 0.0) -> DiffReport:
    a, b = Path(a), Path(b)
    ma, mb = manifest_io.verify(a), manifest_io.verify(b)
    ra, rb = CheckpointReader(a, ma), CheckpointReader(b, mb)
    report = DiffReport(content_digest_a=content_digest(ma), content_digest_b=content_digest(mb))
    # Files kept in earlier checkpoints (selective saves) count as this checkpoint's own.
    fa, fb = {**ma.references, **ma.files}, {**mb.references, **mb.files}
    report.only_in_a = _split_only_in(set(fa) - set(fb), "A", report)
    report.only_in_b = _split_only_in(set(fb) - set(fa), "B", report)
    _compare_manifests(ma, mb, report)
    zero = ma.layout.zero_stage
    for rel in sorted(set(fa) & set(fb)):
        if rel.endswith(".py"):
            continue  # DeepSpeed's copied helper scripts, not state
        same_bytes = content_hash.identity(fa[rel]) == content_hash.identity(fb[rel])
        if rel in INFORMATIONAL:
            if not same_bytes:
                info_a, info_b = _read(ra, rel), _read(rb, rel)
                keys = _differing_keys(info_a, info_b)
                if keys:
                    report.notes.append(_note(rel, keys, "how and where it was run, not what it holds"))
                report.environment += _environment_differences(info_a, info_b)
            continue
        diff = FileDiff(rel, classify(rel, zero))
        if same_bytes:
            diff.compared = 1
        else:
            _compare(_read(ra, rel), _read(rb, rel), diff, atol)
        report.files.append(diff)
    return report
