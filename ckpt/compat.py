"""Can this run load that checkpoint as it is? Checked before any worker starts."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ckpt import manifest as manifest_io
from ckpt.errors import IncompatibleCheckpoint
from ckpt.manifest import Manifest
from ckpt.parallel_layout import Sharding
from ckpt.reader import CheckpointReader

META = "meta.json"


def read_meta(directory: Path, manifest: Manifest) -> dict:
    """meta.json, read once and checked against the manifest (JSON only: nothing unpickled)."""
    return CheckpointReader(directory, manifest).json(META)


def differing_keys(saved: dict, current: dict) -> list[str]:
    keys = sorted(set(saved) | set(current))
    return [f"{k}: checkpoint has {saved.get(k)!r}, this run has {current.get(k)!r}"
            for k in keys if saved.get(k) != current.get(k)]


def check_resumable(directory: str | Path, stage: str, parallel: dict,
                    identity: dict | Callable[[], dict], checksums: bool = True, *,
                    model_files: str | None = None) -> Manifest:
    """Verify the checkpoint, then refuse a different stage, model or layout. `checksums`
    False: structure only, for a loader that checks every byte as it reads it (the
    single-pass load of `ckpt.checkpointer.load_complete`).

    `identity` may be a function that computes it: the launcher's costs an import of torch
    and transformers (seconds), which it is spared when `model_files` (a digest of the
    model directory's config and tokenizer files and of the library versions that read
    them) equals the one the checkpoint's writer recorded: the same inputs give the same
    identity."""
    directory = Path(directory)
    manifest = manifest_io.verify(directory, checksums=checksums)
    if manifest.adopted is not None:
        from ckpt.adopt import state_refusal
        raise state_refusal(directory, manifest, "resumed")
    if manifest.stage != stage:
        raise IncompatibleCheckpoint(directory, f"is a '{manifest.stage}' checkpoint; this is the "
                                     f"'{stage}' stage (start a new stage with stage.init_from=PATH)")
    meta = read_meta(directory, manifest)
    if model_files is None or meta.get("model_files") != model_files:
        current = identity() if callable(identity) else identity
        model_diff = differing_keys(meta.get("model", {}), current)
    else:
        model_diff = []
    if model_diff:
        raise IncompatibleCheckpoint(directory, "model or tokenizer config differs from this run's:\n"
                                     + "\n".join(f"  - {d}" for d in model_diff))
    saved, wanted = manifest.layout.sharding, Sharding.from_dict(parallel)
    if saved != wanted:
        raise IncompatibleCheckpoint(directory, (
            f"saved with parallel.world_size={saved.world_size} parallel.zero_stage="
            f"{saved.zero_stage}, this run uses world_size={wanted.world_size} zero_stage="
            f"{wanted.zero_stage}. A plain resume cannot change the layout; convert it through a "
            f"universal checkpoint first: baton ckpt reshard {directory} DST "
            f"parallel.world_size={wanted.world_size} parallel.zero_stage={wanted.zero_stage}"))
    return manifest
