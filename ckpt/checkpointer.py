"""Save and load a complete checkpoint from inside the worker processes.

DeepSpeed hands model, optimizer and scheduler to `BatonCheckpointEngine`, which
captures them; this module adds the rest of the state (per-rank RNG, data position,
progress, gradient-accumulation record, meta) and runs the save as a `SaveJob`: on the
training thread (`ckpt.mode=sync`) or on the background saver (`async`, the default),
where writing, hashing, fsync and the commit overlap with the next steps.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from ckpt import commit as commit_io
from ckpt import content_hash
from ckpt.background_saver import BackgroundSaver
from ckpt.cleanup import remove_leftovers
from ckpt.deferred_copy import Copier, CopyBatch, UpdateGuard
from ckpt.engine import BatonCheckpointEngine
from ckpt.file_image import ALIGNMENT, DIRECT_ALIGNMENT
from ckpt.layout import step_dirname
from ckpt.lone_rank import barriers_skipped
from ckpt.manifest_recipe import ManifestRecipe
from ckpt.retention import KeepBest
from ckpt.node_copies import NODE, NodeGroup, served_ranks, serves
from ckpt.parallel_layout import Layout
from ckpt.save_job import Faults, SaveJob, SaveRunner
from ckpt.saver_process import ProcessSaver, saver_settings
from ckpt.shared_buffers import SharedBuffers
from ckpt.staging import StagingPool
# The file names: their own module, which readers import without DeepSpeed.
from ckpt.state_files import (DATA, GRAD_RECORD, META, OBJECTIVE, PROGRESS, grad_file,
                              rng_file)
from ckpt.writers import get_writer

log = logging.getLogger(__name__)


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


@dataclass
class SaveOptions:
    """`ckpt.*` of the config: how saves run (docs/async_checkpoints.md)."""

    mode: str = "async"
    """async: the step waits only for the staging copy; sync: for the whole save."""
    snapshot: str = "lazy"
    """async only. lazy: the staging copy runs while the next forward and backward run, and
    the next optimizer step waits for what is left of it; eager: the save call copies."""
    saver: str = "thread"
    """async only. thread: the background work runs on a thread of this process; process:
    in a saver process of its own (ckpt.saver_process), away from the training step's GIL."""
    writer: str = "auto"
    """native (csrc/, when built) | python | auto (native when built)."""
    max_in_flight: int = 1
    """Saves being written at once; one more waits for a free staging slot (counted as stall)."""
    hash: str = "auto"
    """Content hash of the manifest's chunks: auto (sha256 when manifests are signed,
    else xxh3-128), sha256 or xxh3-128 (ckpt.content_hash says why)."""
    hash_threads: int = content_hash.DEFAULT_THREADS
    chunk_bytes: int = content_hash.CHUNK_BYTES
    direct: bool = False
    """O_DIRECT for aligned writes (native writer), bypassing the page cache."""

    selective_threshold: float | None = None
    """Set: save by layer and write only the layers that changed more (ckpt.selective)."""
    selective_full_every: int = 10

    @classmethod
    def from_config(cls, ckpt) -> "SaveOptions":
        options = cls(**{name: getattr(ckpt, name) for name in cls.__dataclass_fields__
                         if getattr(ckpt, name, None) is not None})
        chosen = getattr(ckpt, "selective", None)
        if chosen is not None:
            options.selective_threshold = chosen.threshold
            options.selective_full_every = chosen.full_every
        return options


@dataclass
class Destination:
    """Where one save is committed, when not the run directory (ckpt.tiers)."""

    root: Path
    keep: int
    after_commit: object = None
    """The committing rank: callable(final) -> {tier: outcome}, run once the save is
    committed."""
    per_node: bool = False
    """`root` is this node's own (the memory tier across nodes): each node's leader writes
    the shared files and commits its node's copy (ckpt.node_copies)."""


class Checkpointer:
    def __init__(self, engine, root: Path, stage: str, parallel: dict, keep_last: int,
                 crash_in_save_at_step: int = -1, fail_write_at_step: int = -1,
                 options: SaveOptions | None = None, node: NodeGroup | None = None,
                 keep_best: KeepBest | None = None):
        self.engine, self.root, self.stage = engine, Path(root), stage
        self.parallel, self.keep_last, self.keep_best = parallel, keep_last, keep_best  # manifest; retention
        self.layout = Layout.from_dict(parallel)
        self.options = options or SaveOptions()
        self.asynchronous = self.options.mode == "async"
        self.lazy = (self.asynchronous and self.options.snapshot == "lazy"
                     and lazy_copies_are_safe(engine))
        self.in_process = self.asynchronous and self.options.saver == "process"
        faults = Faults(crash_in_save_at_step, fail_write_at_step)
        self.pool = (StagingPool(self.options.max_in_flight, lazy=self.lazy,
                                 shared=SharedBuffers() if self.in_process else None)
                     if self.asynchronous else None)
        self.copier, self.guard = (Copier(), UpdateGuard()) if self.lazy else (None, None)
        self.io = BatonCheckpointEngine(
            self.pool, DIRECT_ALIGNMENT if self.options.direct else ALIGNMENT)
        engine.checkpoint_engine = self.io
        self.io.defer_json = self.in_process
        if self.options.selective_threshold is not None:
            from ckpt.selective import SelectivePolicy
            self.io.selective = SelectivePolicy(self.options.selective_threshold,
                                                self.options.selective_full_every,
                                                optimizer_names(engine))
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.node = node or NodeGroup(0, tuple(range(self.world)), 1)
        # Who writes the model-states file by DeepSpeed's own rule (rank 0 at ZeRO 0-2,
        # every rank at ZeRO-3); a node copy adds the node's leader (`_capture`).
        self.writes_model_states = bool(getattr(engine, "save_non_zero_checkpoint", self.rank == 0))
        # Its own group: the background thread's handshake never meets a training collective.
        group = dist.new_group(backend="gloo")
        self.writer = get_writer(self.options.writer)
        from ckpt import signing
        alg = content_hash.choose(self.options.hash, signed=signing.key_env() is not None)
        self.hashing = content_hash.scheme(self.options.chunk_bytes, alg)
        self.runner = SaveRunner(self.writer, self.root, keep_last, group, self.rank, self.world,
                                 faults, self.hashing,
                                 self.options.hash_threads, self.options.direct,
                                 release_slot=self.pool.release if self.pool else None,
                                 keep_best=keep_best)
        self._committed: list[tuple[SaveJob, Path, float]] = []
        self._tidy: set[Path] = set()
        """Checkpoints directories whose leftovers this checkpointer removed."""
        self._reported = 0
        self.background = None
        if self.in_process:
            settings = saver_settings(self, faults)
            self.background = ProcessSaver(settings, self.pool.shared, self.pool.release,
                                           self._record, self.rank)
        elif self.asynchronous:
            self.background = BackgroundSaver(self.runner, self.pool.release, self._record)

    def save(self, step: int, payload: SavePayload, to: Destination | None = None) -> Path:
        """Collective: every rank calls it. Returns the checkpoint's final directory: already
        committed (sync), or committed in the background (async; `drain` waits for it).
        `to`: another checkpoints directory (a memory tier) and what follows the commit."""
        started = time.perf_counter()
        self.raise_if_failed()
        if self.background is None and self.asynchronous:
            raise RuntimeError("Checkpointer.save after close()")
        if self.background is not None and self.background.failed():
            # Saves after a failed one would move `latest` past it: this checkpointer is done.
            raise self.background.first_failure
        slot, slot_wait = None, 0.0
        if self.asynchronous:
            slot = self.pool.acquire()  # waits while max_in_flight saves are still writing
            slot_wait = time.perf_counter() - started
        name = step_dirname(step, payload.progress["micro_in_window"])
        root = to.root if to is not None else self.root
        tmp = commit_io.tmp_dir(root, name)
        node = self.node if to is not None and to.per_node and self.node.count > 1 else None
        try:
            job = self._capture(step, name, tmp, payload, slot, node)
        except BaseException:
            if slot is not None:
                slot.deferred = []
                self.pool.release(slot)
            raise
        job.started, job.slot_wait_s = started, slot_wait
        if to is not None:
            job.keep, job.after_commit = to.keep, to.after_commit
        job.node = node.record() if node is not None else None
        if slot is not None and slot.deferred:
            self._copy_later(job, slot)
        job.stall_s = time.perf_counter() - started
        if self.background is not None:
            self.background.submit(job)
            return tmp.with_name(name)
        try:
            final = self.runner.run(job)
        except BaseException:
            self._tidy.clear()  # what a failed save left is removed at the next one
            raise
        self._record(job, final, time.perf_counter() - started)
        self.runner.free_discarded()
        return final

    def _capture(self, step: int, name: str, tmp: Path, payload: SavePayload, slot,
                 node: NodeGroup | None) -> SaveJob:
        if name in self._in_flight_names():
            self.drain()  # the same position again (a preemption right after a save): let
            # that save finish first, then this one replaces it (ckpt.commit.commit)
        root = tmp.parent
        # Who writes the files every rank reads and commits: rank 0, or each node's leader
        # into its own node's copy (ckpt.node_copies).
        shared = self.rank == (node.leader if node is not None else 0)
        if shared:
            root.mkdir(parents=True, exist_ok=True)
            if not self._in_flight_names():
                # Rank 0's launcher holds the stage lock, and no save of ours is in flight:
                # every leftover is a dead save's. (With saves in flight, their commits may
                # be renaming right now; the next idle save cleans up.)
                commit_io.clear_stale_tmp(root, name)
                if root not in self._tidy:
                    # Once per directory: after that only a failed save of ours could
                    # leave one, and a failure clears `_tidy` (a listing per save costs
                    # an every-step save a quarter of a millisecond of the step).
                    for leftover in remove_leftovers(root):
                        log.warning("removed %s: %s", leftover.path, leftover.why)
                    self._tidy.add(root)
        if self.world > 1:  # the others write only after rank 0's clean-up (alone: no wait)
            dist.barrier()
        self.io.begin_save(tmp, slot)
        # DeepSpeed reads this flag at every save: a node copy needs the file on its node.
        self.engine.save_non_zero_checkpoint = self.writes_model_states or (
            node is not None and shared)
        try:
            with barriers_skipped(self.world):
                self.engine.save_checkpoint(str(root), tag=tmp.name, save_latest=False)
        finally:
            self.engine.save_non_zero_checkpoint = self.writes_model_states
        self.io.save_json(tmp / rng_file(self.rank), payload.rng)
        if payload.grad_buffers is not None:
            self.io.save_bytes(tmp / grad_file(self.rank), payload.grad_buffers)
        if shared:
            self.io.save_json(tmp / PROGRESS, payload.progress)
            self.io.save_json(tmp / DATA, payload.data)
            self.io.save_json(tmp / META, payload.meta)
            if payload.grad_record is not None:
                self.io.save_json(tmp / GRAD_RECORD, payload.grad_record)
            if payload.objective is not None:
                self.io.save_json(tmp / OBJECTIVE, payload.objective)
        if slot is not None:
            # A layer file a selective save left in an earlier checkpoint keeps its buffers:
            # the next save that writes it reuses them instead of allocating them again.
            kept = {f.rel for f in self.io.captured} | set(self.io.references)
            self.pool.forget_unused(slot, kept)
        recipe = ManifestRecipe(
            tmp=tmp, stage=self.stage, step=step, parallel=self.parallel,
            zero_stage=self.layout.zero_stage, mid_accumulation=payload.grad_record is not None,
            hashing=self.hashing, extra={"parent": payload.meta.get("parent"), **payload.extra},
            references=dict(self.io.references))  # layer files kept in earlier checkpoints
        return SaveJob(step=step, tmp=tmp, files=list(self.io.captured), build_manifest=recipe,
                       slot=slot)

    def _copy_later(self, job: SaveJob, slot) -> None:
        """Lazy: the copier fills the slot; the writer (piece by piece, ckpt.writers.gate)
        and the next optimizer step (the guard) wait for it, and the step's wait is this
        save's stall too."""
        slot.copies, slot.deferred = CopyBatch(slot.deferred), []

        def waited(seconds: float) -> None:
            job.update_wait_s += seconds

        self.guard.hold(slot.copies, waited)
        self.copier.submit(slot.copies)

    def before_update(self) -> float:
        """Wait for the staging copies still running (what the next optimizer step does by
        itself); returns the seconds waited. A no-op unless `ckpt.snapshot=lazy`."""
        return self.guard.wait_all() if self.guard is not None else 0.0

    def _in_flight_names(self) -> set[str]:
        return self.background.in_flight() if self.background is not None else set()

    def _record(self, job: SaveJob, final: Path, durable_s: float) -> None:
        self._committed.append((job, final, durable_s))

    @property
    def stats(self) -> list[dict]:
        """One dict per committed save. Built when asked: with lazy copies the next
        optimizer step's wait, part of the stall, may come after the commit."""
        return [{"step": job.step, "path": str(final), "stall_s": job.stall_s + job.update_wait_s,
                 "update_wait_s": job.update_wait_s, "slot_wait_s": job.slot_wait_s,
                 "durable_s": durable_s, "background_cpu_s": job.background_cpu_s,
                 "bytes": job.bytes, "tiers": job.placement}
                for job, final, durable_s in self._committed]

    def take_committed(self) -> list[dict]:
        """Stats of the saves committed since the last call (for progress lines)."""
        done = self.stats[self._reported:]
        self._reported += len(done)
        return done

    def raise_if_failed(self) -> None:
        """A background save that failed raises here, at the next step boundary."""
        if self.background is not None:
            self.background.raise_if_failed()

    def failed(self) -> bool:
        """A save of this rank failed (asynchronous saving; sync saves raise at once)."""
        return self.background is not None and self.background.failed()

    def drain(self) -> None:
        """Wait until every save in flight is committed and its retention done; raise the
        first failure. The end of a stage, a preemption and a handoff call it before
        anything reads `latest`."""
        if self.background is not None:
            self.background.drain()

    def wait_committed(self) -> None:
        """Wait until every save in flight is committed (durable, `latest` moved), not for
        the deletion of the checkpoints retention retired; raise the first failure."""
        if self.background is not None:
            self.background.wait_committed()

    def close(self) -> None:
        try:
            if self.background is not None:
                self.background.close()
                self.background = None
        finally:
            if self.guard is not None:
                self.guard.close()
                self.copier.close()
                self.guard = self.copier = None


LAZY_SAFE_OPTIMIZERS = ("AdamW", "Adam", "SGD")
"""torch optimizers that change weights and state only inside step(), and DeepSpeed's
ZeRO wrappers around them write nothing saved before calling that step (read in
DeepSpeed 0.19.8). Muon is not among them: its ZeRO wrappers commit momentum buffers
before the inner step."""


def lazy_copies_are_safe(engine) -> bool:
    """Lazy copies rely on nothing changing the saved state before the next optimizer
    step; for any other optimizer the save call copies (eager), and says so."""
    inner = engine.optimizer
    while not isinstance(inner, torch.optim.Optimizer) and hasattr(inner, "optimizer"):
        inner = inner.optimizer
    name = type(inner).__name__
    safe = (type(inner).__module__.startswith("torch.optim") and name in LAZY_SAFE_OPTIMIZERS
            and not getattr(engine.optimizer, "use_muon", False))
    if not safe:
        log.warning("ckpt.snapshot=lazy: the optimizer %s is not known to change the state "
                    "only inside step(); saves copy the state in the save call (eager)", name)
    return safe


def optimizer_names(engine) -> list[str]:
    """The parameter name behind each optimizer state index (param_groups order)."""
    name_of = {id(p): n for n, p in engine.module.named_parameters()}
    return [name_of[id(p)] for group in engine.optimizer.param_groups for p in group["params"]]


def load_complete(checkpointer: Checkpointer, path: Path, stage: str, parallel: dict,
                  identity: dict) -> dict:
    """Verify, check compatibility, then load DeepSpeed state and baton's state (all ranks)."""
    from ckpt.compat import check_resumable

    checkpointer.before_update()  # a load writes in place: a lazy save's copies land first
    # Structure, signature and compatibility now; every byte is checked as it is read
    # below (each file read once, hashed while read, parsed from the same buffer).
    manifest = check_resumable(path, stage, parallel, identity, checksums=False)
    if not serves(manifest.extra, checkpointer.rank):
        from ckpt.errors import IncompatibleCheckpoint
        raise IncompatibleCheckpoint(path, (
            f"is node {manifest.extra[NODE]['index']}'s copy, holding the files of ranks "
            f"{served_ranks(manifest.extra)}, not those of rank {checkpointer.rank}; resume "
            "with resume=latest, which agrees on a copy every rank can load"))
    io = checkpointer.io
    io.begin_load(path, manifest)
    checkpointer.engine.load_checkpoint(str(path.parent), tag=path.name,
                                        load_optimizer_states=True, load_lr_scheduler_states=True)
    rank = checkpointer.rank
    record = io.load_json(path / GRAD_RECORD) if manifest.mid_accumulation else None
    buffers = None
    if manifest.mid_accumulation and grad_file(rank) in manifest.files:
        buffers = bytes(io.read_verified(path / grad_file(rank)))  # safetensors takes bytes
    return {"manifest": manifest, "progress": io.load_json(path / PROGRESS),
            "data": io.load_json(path / DATA), "rng": io.load_json(path / rng_file(rank)),
            "grad_record": record, "grad_buffers": buffers,
            "objective": io.load_json(path / OBJECTIVE) if OBJECTIVE in manifest.files else None}
