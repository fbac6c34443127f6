"""Reshard a complete checkpoint to another world size / ZeRO stage through DeepSpeed's
universal format, check the result reproduces the source, and commit it at DST.

    SRC (verified) -> universal (DST/../.DST.reshard/) -> target ranks load + save
    (staging) -> equivalence check -> rename staging -> DST

DST exists only once every step passed; the working folder is removed either way.
"""
from __future__ import annotations

import io
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from omegaconf import OmegaConf

from core.config import validate
from core.config.compose import as_dict, config_hash, from_dict
from core.errors import ConfigError
from ckpt import manifest as manifest_io
from ckpt import universal
from ckpt.content_digest import content_digest, content_digest_of
from ckpt.compat import read_meta
from ckpt.equivalence import check_equivalence
from ckpt.errors import ReshardError, ReshardNotEquivalent, ReshardUnsupported
from ckpt.layout import MANIFEST, committed_steps
from ckpt.node_copies import NODE, served_ranks
from ckpt.parallel_layout import Layout, Sharding
from ckpt.reader import CheckpointReader

WORK_SUFFIX = ".reshard"


@dataclass
class ReshardResult:
    source: str
    destination: str
    source_parallel: dict
    target_parallel: dict
    converter: str
    deepspeed_version: str
    input_manifest_sha256: str
    output_manifest_sha256: str
    input_content_digest: str
    """ckpt.content_digest of SRC: what it holds, wherever it lies (its manifest sha256
    also covers where it came from, so an identical copy elsewhere has another)."""
    output_content_digest: str
    equivalence: dict

    def to_dict(self) -> dict:
        return asdict(self)


def target_config(src: Path, meta: dict, overrides: list[str]):
    """SRC's recorded config with the overrides applied, validated as a stage run would be."""
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise ConfigError([f"{o!r}: expected key=value (e.g. parallel.world_size=2)" for o in bad])
    try:
        merged = OmegaConf.merge(OmegaConf.structured(from_dict(meta["config"])),
                                 OmegaConf.from_dotlist(list(overrides)))
        cfg = OmegaConf.to_object(merged)
    except Exception as exc:  # OmegaConf raises several unrelated types
        raise ConfigError([f"{' '.join(overrides)}: {exc}"]) from exc
    if cfg.stage.name != meta["config"]["stage"]["name"]:
        raise ConfigError([f"stage.name={cfg.stage.name}: {src} is a "
                           f"'{meta['config']['stage']['name']}' checkpoint; resharding keeps the stage"])
    problems = validate.problems(cfg)
    if problems:
        raise ConfigError(problems)
    return cfg


def _refuse_early(src: Path, dst: Path, manifest, source: Sharding, target: Sharding) -> None:
    if dst.exists():
        raise ReshardError(dst, "destination already exists; choose a new path (DST is written "
                           "whole or not at all)")
    if source == target:
        raise ReshardError(src, f"already has world_size={source.world_size} zero_stage="
                           f"{source.zero_stage}; nothing to reshard: resume it directly with "
                           f"resume={src}, or pass a parallel.world_size / parallel.zero_stage "
                           "that differs")
    ranks = served_ranks(manifest.extra)
    if ranks is not None and ranks != list(range(source.world_size)):
        raise ReshardUnsupported(src, source.to_dict(), target.to_dict(), (
            f"it is node {manifest.extra[NODE]['index']}'s memory-tier copy, holding the files "
            f"of ranks {ranks} only (ckpt.node_copies), and a reshard reads every rank's. "
            "Reshard a checkpoint of the run directory (the persistent tier) instead"))
    if manifest.mid_accumulation:
        raise ReshardUnsupported(src, source.to_dict(), target.to_dict(), (
            "it was saved mid-accumulation, and the accumulated gradients are per-rank partial sums "
            "of the source's micro-batch split. Reshard a checkpoint taken at an optimizer-step "
            "boundary (a step-N directory without -micro-)"))


def reshard(src: str | Path, dst: str | Path, cfg_overrides: list[str]) -> ReshardResult:
    """Convert SRC to the layout the overrides ask for and commit it at DST (see module doc)."""
    import deepspeed

    src, dst = Path(src).resolve(), Path(dst).resolve()
    manifest = manifest_io.verify(src)  # every checksum, before anything unpickles SRC
    if manifest.adopted is not None:  # weights only: they load under any layout as they are
        from ckpt.adopt import state_refusal
        raise state_refusal(src, manifest, "resharded")
    meta = read_meta(src, manifest)
    cfg = target_config(src, meta, cfg_overrides)
    if cfg.ckpt.signing_key_env:  # DST is signed with the key SRC's run (or the caller) names
        from ckpt import signing
        signing.configure(cfg.ckpt.signing_key_env)
    source, target = manifest.layout.sharding, Layout.from_config(cfg).sharding
    _refuse_early(src, dst, manifest, source, target)
    transform = {"source": str(src), "source_parallel": source.to_dict(),
                 "target_parallel": target.to_dict(),
                 "converter": universal.converter_name(source.zero_stage),
                 "deepspeed_version": deepspeed.__version__,
                 "input_manifest_sha256": manifest_io.checksum_of(src / MANIFEST),
                 "input_content_digest": content_digest(manifest)}
    work = dst.with_name("." + dst.name + WORK_SUFFIX)
    shutil.rmtree(work, ignore_errors=True)  # left by an interrupted reshard to the same DST
    try:
        folder = universal.to_universal(src, work / "universal" / src.name, source.zero_stage,
                                        io.StringIO())
        staged = _run_workers(src, cfg, meta, manifest, folder, work, transform)
        equivalence = check_equivalence(folder, staged, work, cfg)
        if not equivalence["passed"]:
            raise ReshardNotEquivalent(src, dst, equivalence)
        dst.parent.mkdir(parents=True, exist_ok=True)
        staged.rename(dst)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return ReshardResult(
        str(src), str(dst), source.to_dict(), target.to_dict(), transform["converter"],
        transform["deepspeed_version"], transform["input_manifest_sha256"],
        output_manifest_sha256=manifest_io.checksum_of(dst / MANIFEST),
        input_content_digest=transform["input_content_digest"],
        output_content_digest=content_digest_of(dst), equivalence=equivalence)


def _read_json(src: Path, manifest, rel: str) -> dict:
    return CheckpointReader(src, manifest).json(rel)


def _first_traceback(output: str) -> str:
    """A rank's own traceback, not torchrun's report about the rank (which comes last)."""
    found = re.search(r"Traceback \(most recent call last\).*?\n(\[rank\d+\]: )?\w+(Error|Exception)"
                      r"[^\n]*", output, re.S)
    return (found.group(0) if found else output[-3000:])[-4000:]


def _target_progress(progress: dict, cfg) -> dict:
    """Steps, tokens and samples are global; `micro_step` counts this rank's micro-batches,
    which the target's accumulation count rescales (DeepSpeed finds the optimizer-step
    boundary from it)."""
    return {**progress, "micro_step": progress["step"] * Layout.from_config(cfg).accumulation}


def _run_workers(src: Path, cfg, meta: dict, manifest, folder: Path, work: Path,
                 transform: dict) -> Path:
    """Launch the target ranks (same torchrun pattern as stages.launch); return the staged
    checkpoint they committed under `work/staging`."""
    from stages.worker_env import worker_env
    from stages.lifeline import torchrun_command, write_launch_file

    staging = work / "staging"
    launch_file = work / "launch.json"
    binding = write_launch_file(launch_file, {
        "config": as_dict(cfg), "config_hash": config_hash(cfg), "model_dir": meta["model_dir"],
        "parent": {"resharded_from": str(src)}, "source": str(src), "universal": str(folder),
        "fingerprint": universal.fingerprint(folder), "staging": str(staging),
        "progress": _target_progress(_read_json(src, manifest, "progress.json"), cfg),
        "data": _read_json(src, manifest, "data.json"), "data_plan": meta.get("data_plan"),
        "transform": transform,
        "probe_indices": list(range(cfg.stage.micro_batch)),
        "probe_out": str(work / "probe.json")})
    # Under stages.lifeline: the target ranks die with this process, whatever kills it.
    command = torchrun_command(cfg.parallel.world_size, "stages.reshard_worker", launch_file)
    proc = subprocess.run(command, env={**worker_env(cfg.repro), **binding}, capture_output=True, text=True)
    staged = committed_steps(staging)
    if proc.returncode != 0 or not staged:
        source = transform["source_parallel"]
        raise ReshardUnsupported(src, source, transform["target_parallel"], (
            f"the target ranks failed to load or save (exit {proc.returncode}); nothing was "
            f"written. First worker error:\n{_first_traceback(proc.stdout + proc.stderr)}"))
    return staged[-1]
