"""`baton ckpt adopt`: turn a foreign checkpoint into a baton checkpoint holding weights only.

A plain DeepSpeed save keeps its model-states files (and, at ZeRO 3, the optimizer
shards that hold the fp32 weight partitions); a Hugging Face directory's safetensors or
`pytorch_model.bin` weights become `mp_rank_00_model_states.pt` = {"module": state_dict},
the ZeRO-0 layout `ckpt.weights.consolidated_state_dict` reads. Every file is read once,
hashed, loaded with `weights_only=True` (DeepSpeed's allow-list for DeepSpeed files) and
only those same bytes are written: a payload outside the allow-list is refused, never run.

The copy is staged in `.<name>.adopting/` next to the destination, given a manifest
whose `extra["adopted"]` records the origin and the components that are absent, checked
by the caller (the weights load and fit the model) and only then renamed into place.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from ckpt import foreign
from ckpt import manifest as manifest_io
from ckpt.commit import fresh_staging, fsync_dir
from ckpt.errors import CheckpointError, IncompatibleCheckpoint, NotACheckpoint, UnreadablePayload
from ckpt.parallel_layout import Sharding

MODEL_STATES = "mp_rank_00_model_states.pt"
META = "meta.json"
STAGING_SUFFIX = ".adopting"
# What a baton checkpoint has and an adopted one never does.
ABSENT = ("optimizer", "scheduler", "rng", "data", "progress")
KIND_WORDS = {foreign.DEEPSPEED: "DeepSpeed checkpoint", foreign.HF: "Hugging Face model directory"}


class AdoptError(CheckpointError):
    """The source cannot be adopted as it is (not a checkpoint, unsupported layout, ...)."""


def state_refusal(directory: Path, manifest, use: str) -> IncompatibleCheckpoint:
    """Why an adopted checkpoint cannot be `use`d (resumed, carried from): it has weights only."""
    origin = manifest.adopted or {}
    kind = KIND_WORDS.get(origin.get("kind"), "foreign checkpoint")
    return IncompatibleCheckpoint(directory, (
        f"adopted from {origin.get('source', '?')} (a {kind}): "
        f"it has no {'/'.join(origin.get('absent', ABSENT))} state, so it cannot be {use}; use it "
        f"as stage.init_from={directory} (weights only), with init_optimizer, init_scheduler and "
        "init_rng false"))


def _safe_torch_load(data: bytes, source: Path, name: str):
    """weights_only with DeepSpeed's allow-list; anything else is refused, never built."""
    from ckpt.safe_load import load_verified_bytes

    return load_verified_bytes(data, source / name)


def _read(source: Path, name: str) -> tuple[bytes, str]:
    data = (source / name).read_bytes()
    return data, hashlib.sha256(data).hexdigest()


def _deepspeed_layout(found: foreign.Foreign, states: dict) -> dict:
    """world size and ZeRO stage from the rank-0 model states; refuse model/pipeline
    parallel saves (their weights are split in ways baton does not consolidate)."""
    name = found.files[0]
    if not isinstance(states, dict) or "module" not in states:
        raise AdoptError(found.directory, f"{name} has no 'module' entry: not a DeepSpeed "
                         "model-states file")
    mp = states.get("mp_world_size", 1) or 1
    odd = [f for f in found.files if "_mp_rank_00_" not in f and not f.startswith("mp_rank_00_")]
    if mp != 1 or odd:
        raise AdoptError(found.directory, f"model- or pipeline-parallel DeepSpeed checkpoint "
                         f"(mp_world_size={mp}, files {odd[:3]}); only data-parallel saves "
                         "(mp_rank_00) can be adopted")
    zero = ((states.get("ds_config") or {}).get("zero_optimization") or {}).get("stage", 0)
    zero = 3 if found.zero3 else int(zero)
    world = int(states.get("dp_world_size") or 1)
    return {"world_size": world, "zero_stage": zero,
            "step": int(states.get("global_steps") or 0)}


def _stage_deepspeed(found: foreign.Foreign, staging: Path) -> tuple[dict, dict, list[str]]:
    """Copy the files the weights need (ZeRO 3: every shard; else rank 0's model states),
    each safely loaded first. Returns (source sha256s, layout, copied files)."""
    if found.zero3:
        wanted = found.files
    else:
        wanted = [f for f in found.files if f == MODEL_STATES]
        if not wanted:
            raise AdoptError(found.directory, f"no {MODEL_STATES} among {found.files[:4]}")
    hashes, layout = {}, None
    for name in wanted:
        data, digest = _read(found.directory, name)
        states = _safe_torch_load(data, found.directory, name)
        if layout is None and name.endswith("model_states.pt"):
            layout = _deepspeed_layout(found, states)
        (staging / name).write_bytes(data)
        hashes[name] = digest
    if found.zero3 and layout["world_size"] != sum(f.endswith("model_states.pt") for f in wanted):
        raise AdoptError(found.directory, f"ZeRO-3 checkpoint of dp_world_size="
                         f"{layout['world_size']} but {len(wanted) // 2} ranks' files are here; "
                         "copy every rank's zero_pp_rank_*_states.pt files into it")
    return hashes, layout, wanted


def _load_hf_file(directory: Path, name: str, data: bytes) -> dict:
    if name.endswith(".safetensors"):
        from safetensors.torch import load as load_safetensors
        try:
            return load_safetensors(data)
        except Exception as exc:  # safetensors raises its own error types
            raise UnreadablePayload(directory, name, exc) from None
    return _safe_torch_load(data, directory, name)


def _stage_hf(found: foreign.Foreign, staging: Path) -> tuple[dict, dict, list[str]]:
    """Merge every weight file (sharded or not) into one {"module": state_dict}."""
    import torch

    hashes, state = {}, {}
    for name in found.files:
        data, hashes[name] = _read(found.directory, name)
        part = _load_hf_file(found.directory, name, data)
        bad = [k for k, v in part.items() if not isinstance(v, torch.Tensor)]
        if bad:
            raise AdoptError(found.directory, f"{name} holds non-tensor entries {bad[:3]}; "
                             "expected a Hugging Face state dict")
        state.update(part)
    torch.save({"module": state}, staging / MODEL_STATES)
    return hashes, {"world_size": 1, "zero_stage": 0, "step": 0}, [MODEL_STATES]


def _manifest(staging: Path, stage: str, origin: dict, layout: dict, weights: list[str]):
    files = {rel: {"size": (staging / rel).stat().st_size,
                   "sha256": manifest_io.sha256_file(staging / rel)} for rel in weights + [META]}
    return manifest_io.Manifest(
        stage=stage, step=layout["step"], components={"model": list(weights), "meta": [META]},
        files=files, parallel=Sharding.from_dict(layout).to_dict(),
        extra={manifest_io.ADOPTED: origin, "parent": None})


def find_source(source: str | Path) -> foreign.Foreign:
    """The foreign checkpoint at `source`, or a refusal that says what is there instead."""
    source = Path(source).expanduser().resolve()
    if (source / manifest_io.MANIFEST).is_file():
        raise AdoptError(source, "already a baton checkpoint (it has a manifest.json); use it "
                         f"directly as stage.init_from={source}")
    tag = foreign.latest_tag(source) if source.is_dir() else None
    if tag is not None and (tag / manifest_io.MANIFEST).is_file():
        raise AdoptError(source, "a directory of baton checkpoints, which need no adopting; "
                         f"use one directly, e.g. stage.init_from={tag}")
    if not source.is_dir():
        raise NotACheckpoint(source, "no such directory; expected a DeepSpeed checkpoint or a "
                             "Hugging Face model directory")
    found = foreign.detect(source)
    if found is None:
        raise NotACheckpoint(source, (
            "nothing to adopt: expected a DeepSpeed checkpoint (a directory with "
            "*model_states.pt files, or its root with a `latest` file naming one) or a Hugging "
            "Face model directory (config.json + *.safetensors or pytorch_model.bin)"))
    return found


def adopt(source: str | Path, destination: str | Path, stage: str, meta: dict,
          check: Callable[[Path], None] | None = None) -> manifest_io.Manifest:
    """Adopt the checkpoint at `source` as `destination`; return its manifest.

    `meta` is written as meta.json (model identity, model_dir, ...) beside the origin;
    `check(staged_directory)` runs on the complete staged copy before it is renamed into
    place (the caller loads the weights into the model they are for)."""
    found = find_source(source)
    destination = Path(destination).resolve()
    if destination.exists():
        raise AdoptError(destination, "already exists; pass another --name (an adopted copy "
                         "is written whole or not at all)")
    staging = fresh_staging(destination, STAGING_SUFFIX, lambda why: AdoptError(
        destination, f"cannot create it ({why}); pass a run.dir you can write to"))
    try:
        stage_files = _stage_hf if found.kind == foreign.HF else _stage_deepspeed
        hashes, layout, weights = stage_files(found, staging)
        origin = {"source": str(found.root or found.directory), "kind": found.kind,
                  "weights_dir": str(found.directory), "sha256": hashes,
                  "source_step": layout["step"], "absent": list(ABSENT),
                  "adopted_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        (staging / META).write_text(json.dumps(
            {**meta, "adopted": origin, "stage": stage, "parent": None,
             "parallel": Sharding.from_dict(layout).to_dict()},
            indent=1, sort_keys=True))
        manifest = _manifest(staging, stage, origin, layout, weights)
        manifest_io.write(staging, manifest)
        if check is not None:
            check(staging)
        fsync_dir(staging)
        os.rename(staging, destination)
        fsync_dir(destination.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return manifest
