"""The saver process (`ckpt.saver=process`): asynchronous saves finished outside the
training process.

On the saver thread (ckpt.background_saver) a save's Python (the structure pickle, the
per-file bookkeeping, the manifest, the commit, retention: about 10 ms per save of the
default model) holds the GIL the training step needs, and the step pays for it
(docs/async_checkpoints.md, "What a save costs the step"). Here it runs in a process
of its own, started with the checkpointer (ckpt.saver_main):

- The staging buffers are shared memory (ckpt.shared_buffers); each buffer's descriptor
  is sent once, and a save travels as its description with every tensor reduced to its
  place in a buffer (ckpt.saver_wire): no state bytes cross the socket.
- A sender thread here waits for the save's lazy staging copies, then sends it; a
  listener thread receives what became of it: slot released (the buffers may be
  reused), committed, retention done, failed. Saves run in the saver in submission
  order, so `latest` advances in step order.
- Above world size 1 the saver processes agree on each commit over a gloo group of their
  own (rank 0's saver hosts its store on a port rank 0's worker chose and broadcast), so
  the agreement never meets a training collective.
- The saver dies with its worker (PR_SET_PDEATHSIG, checked after it is set), and
  `close` stops it, waiting for it by the handle it was started with. A saver that exits
  on its own fails every save in flight with a clear error; nothing of them is committed.
- A save's `after_commit` (the copies to other tiers) runs here, on the listener thread,
  once the saver reports the commit.
"""
from __future__ import annotations

import logging
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import weakref
from multiprocessing.connection import Connection
from multiprocessing.reduction import send_handle
from pathlib import Path

import torch.distributed as dist

from ckpt import saver_wire
from ckpt.errors import CheckpointWriteFailed
from ckpt.in_flight import InFlightSaves
from ckpt.layout import read_latest
from ckpt.save_job import SaveJob
from ckpt.shared_buffers import SharedBuffers

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 60.0
"""How long `close` waits for the saver to exit after its last save before killing it."""


def _stop(process: subprocess.Popen) -> None:
    """The saver's owner is gone without closing it: it must not outlive it."""
    if process.poll() is None:
        process.kill()
        process.wait()


GROUP_TIMEOUT_S = 1800
"""How long the saver processes' agreement waits for a rank's saver (as torch's default)."""


def saver_settings(checkpointer, faults) -> dict:
    """What the saver process's SaveRunner is built from (ckpt.saver_main), taken from a
    ckpt.checkpointer.Checkpointer. Collective above world size 1: rank 0 picks the port
    of the savers' own group and broadcasts it."""
    group = None
    if checkpointer.world > 1:
        address = [None]
        if checkpointer.rank == 0:
            host = os.environ.get("MASTER_ADDR", "127.0.0.1")
            with socket.socket() as probe:  # a free port, for rank 0's saver to bind
                probe.bind((host, 0))
                address = [(host, probe.getsockname()[1])]
        dist.broadcast_object_list(address, src=0)
        group = {"addr": address[0][0], "port": address[0][1], "timeout_s": GROUP_TIMEOUT_S}
    options = checkpointer.options
    return {"root": checkpointer.root, "keep_last": checkpointer.keep_last,
            "keep_best": checkpointer.keep_best,
            "rank": checkpointer.rank, "world": checkpointer.world, "faults": faults,
            "hashing": checkpointer.hashing, "threads": options.hash_threads,
            "direct": options.direct, "writer": checkpointer.writer.name, "group": group,
            "log_level": logging.getLogger().getEffectiveLevel()}


def saver_environment() -> dict[str, str]:
    """The worker's environment without torchrun's TORCHELASTIC_* settings: with them,
    torch would make the savers' group a client of the launcher's store instead of
    hosting its own, and the savers would wait for each other forever."""
    return {name: value for name, value in os.environ.items()
            if not name.startswith("TORCHELASTIC_")}


class ProcessSaver(InFlightSaves):
    def __init__(self, settings: dict, shared: SharedBuffers, release_slot, on_done, rank: int):
        super().__init__()
        self.shared, self._release, self._on_done, self.rank = shared, release_slot, on_done, rank
        self._wire = saver_wire.Sender(shared)
        mine, theirs = socket.socketpair()
        with theirs:
            # Started from the thread that builds the checkpointer (the worker's main
            # thread): PR_SET_PDEATHSIG fires when the thread that started it exits.
            self.process = subprocess.Popen(
                [sys.executable, "-m", "ckpt.saver_main", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=saver_environment())
        self._finalizer = weakref.finalize(self, _stop, self.process)
        self.conn = Connection(mine.detach())
        self.conn.send(("setup", settings))
        self._jobs: dict[int, SaveJob] = {}
        self._settled: set[int] = set()
        """Saves the saver committed whose retention it has not reported done."""
        self._gone = False
        self.exit_code: int | None = None
        self._next = 0
        self._outbox: queue.Queue = queue.Queue()
        self._sender = threading.Thread(target=self._send_loop, name="baton-ckpt-sender",
                                        daemon=True)
        self._listener = threading.Thread(target=self._listen_loop, name="baton-ckpt-listener",
                                          daemon=True)
        self._sender.start()
        self._listener.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def submit(self, job: SaveJob) -> None:
        self._submitted(job)
        with self._idle:
            ident, self._next = self._next, self._next + 1
            self._jobs[ident] = job
            gone = self._gone
        if gone:  # registered first: either this or the listener's clean-up fails it
            self._fail_orphans()
            return
        self._outbox.put((ident, job))

    # -- the sender thread ------------------------------------------------------------
    def _send_loop(self) -> None:
        try:
            while True:
                item = self._outbox.get()
                if item is None:
                    self.conn.send(("stop",))
                    return
                self._send(*item)
        except OSError:  # the saver is gone: the listener reports it
            return
        except Exception:  # noqa: BLE001 - a bug here must not leave saves waiting forever
            log.exception("the checkpoint sender thread failed; stopping the saver process")
            self.process.kill()  # our own child: the listener fails every save in flight

    def _send(self, ident: int, job: SaveJob) -> None:
        """A save that cannot be handed over (its staging copy failed, or its description
        does not pickle) still goes to the saver, as an error: there it fails through
        the same agreement as a failed write, so every rank learns of it."""
        error = None
        copies = job.slot.copies if job.slot is not None else None
        if copies is not None:
            copies.done.wait()  # the saver reads the buffers: the lazy copies land first
            if copies.error is not None:
                error = f"staging copy failed: {type(copies.error).__name__}: {copies.error}"
        if job.slot is not None:
            job.slot.device_ready()
        dropped = self.shared.take_dropped()
        if dropped:  # buffers of earlier saves the pool let go (ckpt.shared_buffers)
            self.conn.send(("forget", dropped))
        for buffer, nbytes, fd in self.shared.take_unsent():
            try:
                self.conn.send(("buffer", buffer, nbytes))
                send_handle(self.conn, fd, self.process.pid)
            finally:
                os.close(fd)  # mapped here and, once received, there
        description = {"step": job.step, "tmp": job.tmp, "keep": job.keep, "node": job.node,
                       "recipe": job.build_manifest, "error": error,
                       "files": [] if error else job.files}
        try:
            blob = self._wire.dumps(description)
        except Exception as exc:  # noqa: BLE001 - reported as this save's failure
            log.exception("could not hand the save of step %d to the saver process", job.step)
            blob = self._wire.dumps({**description, "files": [], "recipe": None, "error": (
                f"could not hand the save to the saver process: {type(exc).__name__}: {exc}")})
        self.conn.send(("job", ident, blob))

    # -- the listener thread ----------------------------------------------------------
    def _listen_loop(self) -> None:
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                self._saver_gone()
                return
            if message[0] == "stopped":
                return
            kind, ident = message[0], message[1]
            with self._idle:
                job = self._jobs[ident]
            if kind == "released":
                self._release_slot(job)
            elif kind == "committed":
                self._settled.add(ident)
                self._committed(job, Path(message[2]), message[3])
            elif kind in ("tidy", "skipped", "failed"):
                if kind == "failed":
                    self._fail(message[2])
                self._release_slot(job)
                if kind != "tidy":
                    self._settle()
                self._forget(ident, job)

    def _committed(self, job: SaveJob, final: Path, cpu_s: float) -> None:
        job.background_cpu_s = cpu_s
        try:
            if self.rank == job.committer and job.after_commit is not None:
                # Copies to other tiers: each one's failure is recorded there, never this save's.
                job.placement = job.after_commit(final)
            self._on_done(job, final, time.perf_counter() - job.started)
        except BaseException as exc:  # noqa: BLE001 - surfaced on the training thread
            log.exception("after the commit of step %d", job.step)
            self._fail(exc)
        finally:
            self._settle()

    def _release_slot(self, job: SaveJob) -> None:
        if job.slot is not None:
            slot, job.slot = job.slot, None
            self._release(slot)

    def _forget(self, ident: int, job: SaveJob) -> None:
        with self._idle:
            self._jobs.pop(ident, None)
            self._settled.discard(ident)
        self._finished(job)

    def _saver_gone(self) -> None:
        """The saver exited (or its socket broke): every save in flight fails, and
        nothing of them is committed; so does every later one (`submit`)."""
        try:
            self.exit_code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.exit_code = None
        with self._idle:
            self._gone = True
        self._fail_orphans()

    def _fail_orphans(self) -> None:
        with self._idle:
            orphans = sorted(self._jobs.items())
            self._jobs.clear()
            settled, self._settled = self._settled, set()
        for ident, job in orphans:
            self._release_slot(job)
            if ident not in settled:  # a committed one had only its retention left
                error = OSError(None, f"the checkpoint saver process (pid {self.process.pid}) "
                                      f"exited with code {self.exit_code} before the save was "
                                      "committed")
                error.internal = True
                latest = read_latest(job.tmp.parent)
                self._fail(CheckpointWriteFailed(job.tmp, job.step, error,
                                                 latest.name if latest else None))
                self._settle()
            self._finished(job)

    def close(self) -> None:
        try:
            self.drain()
        finally:
            self._outbox.put(None)
            self._sender.join()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.error("the checkpoint saver process (pid %d) did not stop; killing it",
                          self.process.pid)
            self._finalizer()  # kills it if it is still there, and waits for it
            self._listener.join()
            self.conn.close()
            self.shared.close()
