"""One save, from captured files to a committed checkpoint: write, make durable, agree, commit.

Runs on the training thread (`ckpt.mode=sync`) or on the background saver's thread
(`async`). Every rank writes and fsyncs its own files, then all ranks exchange what they
wrote (or why they could not) on the checkpoint process group, a group of its own so
this exchange never interleaves with training collectives. Rank 0 commits only when
every rank's files are durable (manifest last, rename, `latest`), then tells every rank
the outcome: all ranks learn of a failure at the same time, and `latest` stays at the
previous checkpoint. A node copy (ckpt.node_copies) is committed by each node's leader
with its own ranks' files, and the save counts only if every node's commit did.
"""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist

from ckpt import commit as commit_io
from ckpt import content_hash
from ckpt.errors import CheckpointWriteFailed, NodeCopyIncomplete
from ckpt.file_image import FileImage, as_bytes, image_of
from ckpt.layout import MANIFEST, read_latest
from ckpt.retention import KeepBest
from ckpt.staging import Slot

log = logging.getLogger(__name__)


@dataclass
class CapturedFile:
    rel: str
    image: FileImage | None = None
    buffers: list = field(default_factory=list)
    """What fills the image's holes: staged copies (async) or the live storages (sync)."""
    state: object = None
    """Async: a structural copy on staged storages (ckpt.snapshot), pickled by `materialize`."""
    json: object = None
    """Async: a copied JSON payload, encoded by `materialize`."""
    alignment: int = 64

    def materialize(self, slot: Slot | None = None) -> None:
        """Turn what the training thread captured into an image (background thread);
        `slot` holds the staged buffers' kept byte views."""
        if self.json is not None:
            self.image = FileImage.of_bytes(encode_json(self.json))
        elif self.state is not None:
            self.image = image_of(self.state, self.alignment)
            view = slot.byte_view if slot is not None else as_bytes
            self.buffers = [view(s) for s in self.image.storages]
        self.state = self.json = None


def encode_json(payload) -> bytes:
    """One line on purpose: without `indent` the json module uses its C encoder, ten times
    faster for the RNG state's long integer lists (`baton ckpt inspect` pretty-prints)."""
    return json.dumps(payload, sort_keys=True).encode()


class NotPlainJson(TypeError):
    """A payload `json_copy` does not copy: it is encoded at once instead."""


_JSON_LEAVES = frozenset((str, int, float, bool, type(None)))


def json_copy(value):
    """A copy of plain JSON data (dicts with string keys, lists, strings, numbers, booleans,
    None) that nothing the caller changes later can reach; anything else raises NotPlainJson.
    Leaves are immutable, so only the containers are rebuilt; a list of leaves (the RNG
    states' long integer lists) without a Python call per item."""
    kind = type(value)
    if kind is dict:
        if not all(type(key) is str for key in value):
            raise NotPlainJson("a key that is not a string")
        return {key: json_copy(item) for key, item in value.items()}
    if kind is list:
        if _JSON_LEAVES.issuperset(map(type, value)):  # C loops, no Python call per item
            return list(value)
        return [json_copy(item) for item in value]
    if kind in _JSON_LEAVES:
        return value
    raise NotPlainJson(f"a {kind.__name__}")


@dataclass
class SaveJob:
    step: int
    tmp: Path
    files: list[CapturedFile]
    build_manifest: object
    """The committer: callable(entries: dict[rel, entry], node record or None) -> Manifest."""
    slot: Slot | None = None
    keep: int | None = None
    """Retention in this job's checkpoints directory (None: the runner's keep_last)."""
    after_commit: object = None
    """The committing rank, once committed: callable(final) -> {tier: outcome}
    (ckpt.tiers.replicate)."""
    node: dict | None = None
    """A node copy: {"index", "ranks"} of this rank's node, plus "save" (`save_identity`)
    once every rank reported (None: one copy, rank 0 commits)."""
    placement: dict = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)
    stall_s: float = 0.0
    """The save call's own time (slot wait included)."""
    slot_wait_s: float = 0.0
    update_wait_s: float = 0.0
    """Lazy copies: what the next optimizer step waited for them (also stall)."""
    background_cpu_s: float | None = None
    """Async: the saver thread's CPU time for this save (the native writer's own threads
    not counted). Mostly Python holding the GIL: what it costs the training thread.
    None for a sync save, which has no saver thread."""

    @property
    def bytes(self) -> int:
        return sum(f.image.size for f in self.files if f.image is not None)

    @property
    def committer(self) -> int:
        """The rank that writes this job's manifest: rank 0, or the node's leader."""
        return self.node["ranks"][0] if self.node is not None else 0


@dataclass
class Faults:
    """debug.crash_in_save_at_step / debug.fail_write_at_step (rank 0 only)."""

    crash_at: int = -1
    fail_write_at: int = -1


def failure_of(exc: BaseException, rank: int) -> dict:
    """What a rank reports about a failed write (picklable, sent to every rank)."""
    if isinstance(exc, OSError):
        return {"rank": rank, "errno": exc.errno, "strerror": exc.strerror or str(exc),
                "filename": str(exc.filename) if exc.filename else None}
    return {"rank": rank, "errno": None, "filename": None,
            "strerror": f"{type(exc).__name__}: {exc}"}


class SaveRunner:
    def __init__(self, writer, root: Path, keep_last: int, group, rank: int, world: int,
                 faults: Faults, hashing: dict, threads: int, direct: bool,
                 release_slot=None, keep_best: KeepBest | None = None):
        self.writer, self.root, self.keep_last = writer, Path(root), keep_last
        self.keep_best = keep_best
        """Also keep the best k by a metric (ckpt.retention); this runner's own root only."""
        self.group, self.rank, self.world, self.faults = group, rank, world, faults
        self.hashing, self.threads, self.direct = hashing, threads, direct
        self.release_slot = release_slot
        """The staging pool's release: a slot is free once this rank's files are written."""
        self.discarded: list[Path] = []
        """Checkpoints retention renamed out of the way, deleted by `free_discarded`."""

    def run(self, job: SaveJob) -> Path:
        """Write this rank's files, agree with every rank, commit. Raises
        CheckpointWriteFailed on every rank when any rank's write failed."""
        written, failure = {}, None
        try:
            written = self._write_all(job)
        except Exception as exc:  # noqa: BLE001 - the other ranks wait for this rank's report
            failure = failure_of(exc, self.rank)
        self._release_slot(job)
        if failure is None and job.step == self.faults.crash_at and self.rank == 0:
            log.error("debug.crash_in_save_at_step=%d: SIGKILL before the manifest", job.step)
            self.crash()
        result = self._agree(job, {"written": written, "failure": failure})
        if "failure" in result:
            raise self._write_failed(job, result["failure"], result.get("committed_here"))
        final = Path(result["final"])
        if self.rank == job.committer and job.after_commit is not None:
            # Copies to other tiers: each one's failure is recorded there, never this save's.
            job.placement = job.after_commit(final)
        return final

    def crash(self) -> None:
        """debug.crash_in_save_at_step: the worker dies as if killed mid-save."""
        os.kill(os.getpid(), signal.SIGKILL)

    def _agree(self, job: SaveJob, report: dict) -> dict:
        """Every rank's report to rank 0, its commit's outcome back to every rank. Alone,
        the exchange is skipped: it pickles both ways on the saver thread, holding the
        GIL the training thread needs (docs/async_checkpoints.md)."""
        if self.world == 1:
            return self._commit(job, [report])
        reports = [None] * self.world
        dist.all_gather_object(reports, report, group=self.group)
        if job.node is not None:
            return self._agree_per_node(job, reports)
        outcome = [self._commit(job, reports) if self.rank == 0 else None]
        dist.broadcast_object_list(outcome, src=0, group=self.group)
        return outcome[0]

    def _agree_per_node(self, job: SaveJob, reports: list[dict]) -> dict:
        """Each node's leader commits its node's copy once every rank's files are durable
        (on every node: a node must not commit a step another node could not write); then
        every rank learns every node's outcome. A node that committed while another
        failed keeps its copy: a restore agrees on a step every node holds
        (stages.tier_restore), so the lone copy is never used on its own. For the same
        reason retention waits for every node's outcome: a node drops its older copies
        only once every node holds the new one."""
        failed = next((r["failure"] for r in reports if r["failure"] is not None), None)
        if failed is not None:
            if self.rank == job.committer:
                shutil.rmtree(job.tmp, ignore_errors=True)
            return {"failure": failed}
        job.node = {**job.node, "save": save_identity(job.tmp.name, reports)}
        outcome = (self._commit(job, [reports[r] for r in job.node["ranks"]], retain=False)
                   if self.rank == job.committer else None)
        outcomes = [None] * self.world
        dist.all_gather_object(outcomes, outcome, group=self.group)
        failed = next((o["failure"] for o in outcomes if o is not None and "failure" in o), None)
        if failed is not None:
            mine = outcomes[job.committer]
            return {"failure": failed, "committed_here": mine.get("final") if mine else None}
        if self.rank == job.committer:
            self._retain(job)
        return outcomes[job.committer]

    def _release_slot(self, job: SaveJob) -> None:
        """Nothing reads the staging buffers any more: the next save may fill them while
        this one agrees and commits (with one slot, it would otherwise wait for that too)."""
        if job.slot is not None and self.release_slot is not None:
            slot, job.slot = job.slot, None
            self.release_slot(slot)

    def free_discarded(self) -> None:
        """Delete what retention renamed away (after the commit was reported: freeing the
        bytes is housekeeping, not part of making this checkpoint durable)."""
        doomed, self.discarded = self.discarded, []
        for path in doomed:
            shutil.rmtree(path, ignore_errors=True)

    def _write_all(self, job: SaveJob) -> dict[str, dict]:
        for captured in job.files:
            captured.materialize(job.slot)  # pickling needs the staged storages' sizes, not their bytes
        copies = job.slot.copies if job.slot is not None else None
        if job.slot is not None:
            job.slot.device_ready()  # device-to-host copies land before the writer reads
        try:
            return self._write_files(job, copies)
        finally:
            if copies is not None:
                # Also after a failed write: the slot is reused only once nothing copies
                # into it. A failed copy is the cause of a cancelled write: raised here.
                copies.done.wait()
                copies.wait()

    def _write_files(self, job: SaveJob, copies) -> dict[str, dict]:
        """Lazy copies may still be running: each file's writer follows them piece by
        piece (ckpt.writers.gate), so writing starts with the first copied piece."""
        chunk = content_hash.chunk_bytes_of(self.hashing)
        written, directories = {}, {job.tmp}
        for captured in job.files:
            path = job.tmp / captured.rel
            if job.step == self.faults.fail_write_at and self.rank == 0:
                self.faults.fail_write_at = -1
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
            path.parent.mkdir(parents=True, exist_ok=True)
            directories.add(path.parent)
            segments = captured.image.segments(captured.buffers)
            chunks = self.writer.write_file(
                str(path), captured.image.size, segments,
                chunk_bytes=chunk, threads=self.threads, direct=self.direct,
                alg=content_hash.alg_of(self.hashing),
                gate=copies.gate(segments) if copies is not None else None)
            written[captured.rel] = content_hash.entry(captured.image.size, chunks)
        for directory in sorted(directories, reverse=True):  # entries durable, deepest first
            commit_io.fsync_dir(directory)
        return written

    def _commit(self, job: SaveJob, reports: list[dict], retain: bool = True) -> dict:
        """Rank 0 (or a node's leader). Always returns an outcome (the other ranks wait for
        it): a failure only while nothing was renamed into place, so `latest` is untouched.
        `retain`: apply retention now (a node copy waits for every node's outcome)."""
        failures = [r["failure"] for r in reports if r["failure"] is not None]
        if failures:
            shutil.rmtree(job.tmp, ignore_errors=True)
            return {"failure": failures[0]}
        entries = {rel: e for report in reports for rel, e in report["written"].items()}
        final = commit_io.final_dir(job.tmp)
        try:
            commit_io.commit(job.tmp, job.build_manifest(entries, job.node))
        except Exception as exc:  # noqa: BLE001
            if job.tmp.exists() or not (final / MANIFEST).is_file():
                shutil.rmtree(job.tmp, ignore_errors=True)
                return {"failure": failure_of(exc, self.rank)}  # rank 0 or a node's leader
            # Renamed with its manifest: committed. Only moving `latest` failed.
            log.warning("committed %s but could not point `latest` at it: %s", final, exc)
        if retain:
            self._retain(job)
        return {"final": str(final)}

    def _retain(self, job: SaveJob) -> None:
        try:
            own = job.keep is None  # a job for another tier's directory brings its own count
            removed = commit_io.apply_retention(
                job.tmp.parent, self.keep_last if own else job.keep, self.discarded,
                self.keep_best if own else None)
            if removed:
                log.info("retention removed %s", ", ".join(p.name for p in removed))
        except OSError as exc:  # old checkpoints stay; the next save retries
            log.warning("retention could not remove an old checkpoint: %s", exc)

    def _write_failed(self, job: SaveJob, failure: dict,
                      committed_here: str | None = None) -> CheckpointWriteFailed:
        exc = OSError(failure["errno"], failure["strerror"], failure["filename"])
        exc.internal = failure["errno"] is None
        file = None
        if failure["filename"]:
            name = Path(failure["filename"])
            file = name.relative_to(job.tmp).as_posix() if name.is_relative_to(job.tmp) else str(name)
        if committed_here is not None:  # this node's copy is in place; another node's is not
            return NodeCopyIncomplete(job.tmp, job.step, exc, job.node, failure["rank"], file)
        latest = read_latest(job.tmp.parent)
        return CheckpointWriteFailed(job.tmp, job.step, exc, latest.name if latest else None, file)


def save_identity(name: str, reports: list[dict]) -> str:
    """One id for a save across its node copies: a digest of every rank's reported state
    files (meta.json, which records times and argv, left out). Every rank computes it from
    the same gathered reports, so every node's copy of one save records the same id, and
    a copy from another save at the same step (a restart re-saved it) records another.
    A restore agrees on a step only where every node's copy has the same id."""
    from ckpt.content_digest import is_state_file

    hashed = hashlib.sha256(name.encode())
    for rank, report in enumerate(reports):
        for rel in sorted(report["written"]):
            if is_state_file(rel):
                hashed.update(f"\n{rank}:{rel}:{content_hash.identity(report['written'][rel])}".encode())
    return "save1:" + hashed.hexdigest()
