"""Save and load a complete checkpoint from inside the worker processes.

DeepSpeed writes model, optimizer and scheduler through `BatonCheckpointEngine`;
this module adds the rest of the state (per-rank RNG, data position, progress,
gradient-accumulation record, meta) and runs the commit protocol on rank 0 once
every rank reported its files.
"""
from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist

from ckpt import commit as commit_io
from ckpt import manifest as manifest_io
from ckpt.cleanup import remove_leftovers
from ckpt.engine import BatonCheckpointEngine
from ckpt.errors import CheckpointWriteFailed
from ckpt.layout import MANIFEST, read_latest, step_dirname
from ckpt.parallel_layout import Layout

log = logging.getLogger(__name__)

RNG_DIR, GRAD_DIR = "rng", "grad_accum"
PROGRESS, DATA, META, GRAD_RECORD = "progress.json", "data.json", "meta.json", "grad_accum.json"
# The objective's own state (RL: KL controller, reference and reward-model identity).
OBJECTIVE = "objective.json"


def rng_file(rank: int) -> str:
    return f"{RNG_DIR}/rank-{rank:05d}.json"


def grad_file(rank: int) -> str:
    return f"{GRAD_DIR}/rank-{rank:05d}.safetensors"


def classify(rel: str, zero_stage: int) -> list[str]:
    """Components a file holds. DeepSpeed puts the scheduler (and, without ZeRO, the
    optimizer) into the model-states file."""
    name = rel.rsplit("/", 1)[-1]
    if name.endswith("optim_states.pt"):
        return ["optimizer"]
    if name.endswith("model_states.pt"):
        parts = ["model"]
        if name.startswith("mp_rank_00") or name.startswith("zero_pp_rank_0_"):
            parts.append("scheduler")
            if zero_stage == 0:
                parts.append("optimizer")
        return parts
    if rel.startswith(RNG_DIR + "/"):
        return ["rng"]
    if rel.startswith(GRAD_DIR + "/") or rel == GRAD_RECORD:
        return [manifest_io.GRAD_ACCUM]
    return {PROGRESS: ["progress"], DATA: ["data"], META: ["meta"],
            OBJECTIVE: [manifest_io.RL_STATE]}.get(rel, [])


@dataclass
class SavePayload:
    """What the worker hands over besides the DeepSpeed engine's own state."""

    progress: dict
    data: dict
    meta: dict
    rng: dict
    grad_record: dict | None = None
    """Set mid-accumulation: window-start RNG + the micro-batches already consumed."""
    grad_buffers: bytes | None = None
    """safetensors bytes of this rank's accumulated gradients, when readable (ZeRO 0)."""
    extra: dict = field(default_factory=dict)
    objective: dict | None = None
    """The objective's state_dict() (None: the objective keeps none), written by rank 0."""


class Checkpointer:
    def __init__(self, engine, root: Path, stage: str, parallel: dict, keep_last: int,
                 crash_in_save_at_step: int = -1, fail_write_at_step: int = -1):
        self.engine, self.root, self.stage = engine, Path(root), stage
        self.parallel, self.keep_last = parallel, keep_last  # the manifest's `parallel`
        self.layout = Layout.from_dict(parallel)
        self.crash_at, self.fail_write_at = crash_in_save_at_step, fail_write_at_step
        self.io = BatonCheckpointEngine()
        engine.checkpoint_engine = self.io
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def save(self, step: int, payload: SavePayload) -> Path:
        """Collective: every rank calls it. Returns the committed directory."""
        name = step_dirname(step, payload.progress["micro_in_window"])
        tmp = commit_io.tmp_dir(self.root, name)
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            commit_io.clear_stale_tmp(self.root, name)
            # Rank 0's launcher holds the stage lock: every other .tmp is a dead save's.
            for leftover in remove_leftovers(self.root):
                log.warning("removed %s: %s", leftover.path, leftover.why)
        dist.barrier()
        try:
            final = self._write_and_commit(step, name, tmp, payload)
        except OSError as exc:  # disk full, quota, I/O error: say so, keep `latest` as it was
            raise self._write_failed(step, tmp, exc) from None
        dist.barrier()
        return final

    def _write_and_commit(self, step: int, name: str, tmp: Path, payload: SavePayload) -> Path:
        self.io.begin_save(tmp)
        if step == self.fail_write_at and self.rank == 0:
            self.io.fail_next_write = errno.ENOSPC
        self.engine.save_checkpoint(str(self.root), tag=tmp.name, save_latest=False)
        self.io.save_json(tmp / rng_file(self.rank), payload.rng)
        if payload.grad_buffers is not None:
            self.io.save_bytes(tmp / grad_file(self.rank), payload.grad_buffers)
        if self.rank == 0:
            self.io.save_json(tmp / PROGRESS, payload.progress)
            self.io.save_json(tmp / DATA, payload.data)
            self.io.save_json(tmp / META, payload.meta)
            if payload.grad_record is not None:
                self.io.save_json(tmp / GRAD_RECORD, payload.grad_record)
            if payload.objective is not None:
                self.io.save_json(tmp / OBJECTIVE, payload.objective)
        if step == self.crash_at and self.rank == 0:
            log.error("debug.crash_in_save_at_step=%d: SIGKILL before the manifest", step)
            os.kill(os.getpid(), signal.SIGKILL)
        gathered = [None] * self.world
        dist.all_gather_object(gathered, self.io.written)
        final = tmp.with_name(name)
        if self.rank == 0:
            files = {rel: entry for written in gathered for rel, entry in written.items()}
            final = commit_io.commit(tmp, self._manifest(tmp, step, files, payload))
            removed = commit_io.apply_retention(self.root, self.keep_last)
            if removed:
                log.info("retention removed %s", ", ".join(p.name for p in removed))
        return final

    def _write_failed(self, step: int, tmp: Path, exc: OSError) -> CheckpointWriteFailed:
        """`latest` was never moved, so it stays sound. The partial `.tmp` only takes space
        on a full disk: remove it now (best effort; whatever another rank still writes into it
        is cleared by the next save of this step)."""
        shutil.rmtree(tmp, ignore_errors=True)
        latest = read_latest(self.root)
        file = None
        if exc.filename:
            name = Path(str(exc.filename))
            file = name.relative_to(tmp).as_posix() if name.is_relative_to(tmp) else str(name)
        return CheckpointWriteFailed(tmp, step, exc, latest.name if latest else None, file)

    def _manifest(self, tmp: Path, step: int, files: dict, payload: SavePayload):
        # Files DeepSpeed copies without its engine (its zero_to_fp32.py helper) are hashed here.
        for path in tmp.rglob("*"):
            rel = path.relative_to(tmp).as_posix()
            if path.is_file() and rel not in files and rel != MANIFEST:
                files[rel] = {"size": path.stat().st_size, "sha256": manifest_io.sha256_file(path)}
        components: dict[str, list[str]] = {}
        for rel in sorted(files):
            for name in classify(rel, self.layout.zero_stage):
                components.setdefault(name, []).append(rel)
        return manifest_io.Manifest(
            stage=self.stage, step=step, components=components, files=files,
            parallel=self.parallel, mid_accumulation=payload.grad_record is not None,
            extra={"parent": payload.meta.get("parent"), **payload.extra})


def load_complete(checkpointer: Checkpointer, path: Path, stage: str, parallel: dict,
                  identity: dict) -> dict:
    """Verify, check compatibility, then load DeepSpeed state and baton's state (all ranks)."""
    from ckpt.compat import check_resumable

    manifest = check_resumable(path, stage, parallel, identity)
    io = checkpointer.io
    io.begin_load(path, manifest)
    checkpointer.engine.load_checkpoint(str(path.parent), tag=path.name,
                                        load_optimizer_states=True, load_lr_scheduler_states=True)
    rank = checkpointer.rank
    record = io.load_json(path / GRAD_RECORD) if manifest.mid_accumulation else None
    buffers = None
    if manifest.mid_accumulation and grad_file(rank) in manifest.files:
        buffers = io.read_verified(path / grad_file(rank))
    return {"manifest": manifest, "progress": io.load_json(path / PROGRESS),
            "data": io.load_json(path / DATA), "rng": io.load_json(path / rng_file(rank)),
            "grad_record": record, "grad_buffers": buffers,
            "objective": io.load_json(path / OBJECTIVE) if OBJECTIVE in manifest.files else None}
