"""The thread that finishes asynchronous saves while training goes on.

Jobs run one after another in submission order, so commits (and `latest`) advance in
step order. The first failure is kept and raised on the training thread at its next
step boundary (`raise_if_failed`), at `drain`, or at the next save: never silently
dropped. Saves queued behind a failed one are discarded, not committed.

After a commit the thread deletes the checkpoints retention retired; `wait_committed`
returns before that, `drain` after.
"""
from __future__ import annotations

import logging
import queue
import shutil
import threading
import time

from ckpt.errors import CheckpointWriteFailed
from ckpt.save_job import SaveJob, SaveRunner

log = logging.getLogger(__name__)


class BackgroundSaver:
    def __init__(self, runner: SaveRunner, release_slot, on_done):
        self.runner, self._release, self._on_done = runner, release_slot, on_done
        self._jobs: queue.Queue = queue.Queue()
        self._idle = threading.Condition()
        self._pending = 0
        self._unsettled = 0
        """Submitted saves neither committed nor failed yet."""
        self._pending_dirs: list[str] = []
        self.failure: BaseException | None = None
        """The first failure, until raised on the training thread."""
        self.first_failure: BaseException | None = None
        self._failed = False
        self._thread = threading.Thread(target=self._loop, name="baton-ckpt-saver", daemon=True)
        self._thread.start()

    def submit(self, job: SaveJob) -> None:
        with self._idle:
            self._pending += 1
            self._unsettled += 1
            self._pending_dirs.append(job.tmp.name)
        self._jobs.put(job)

    def in_flight(self) -> set[str]:
        """Names of the `.tmp` directories of saves not yet committed or failed."""
        with self._idle:
            return set(self._pending_dirs)

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            settled = False
            try:
                if self._failed:
                    # After a failure no later save may commit (`latest` would move past
                    # the one reported as failed). Every rank learned of the failure from
                    # the same outcome of the same job, so every rank skips the same jobs.
                    shutil.rmtree(job.tmp, ignore_errors=True)
                    continue
                cpu = time.thread_time()
                final = self.runner.run(job)
                job.background_cpu_s = time.thread_time() - cpu
                self._on_done(job, final, time.perf_counter() - job.started)
                self._settle()
                settled = True  # what follows is housekeeping: wait_committed may return
                self.runner.free_discarded()
            except BaseException as exc:  # noqa: BLE001 - surfaced on the training thread
                if not isinstance(exc, CheckpointWriteFailed):
                    log.exception("background checkpoint save of step %d failed", job.step)
                self._fail(exc)
            finally:
                if job.slot is not None:
                    self._release(job.slot)
                if not settled:
                    self._settle()
                with self._idle:
                    self._pending -= 1
                    self._pending_dirs.remove(job.tmp.name)
                    self._idle.notify_all()

    def _settle(self) -> None:
        with self._idle:
            self._unsettled -= 1
            self._idle.notify_all()

    def _fail(self, exc: BaseException) -> None:
        with self._idle:
            self._failed = True
            if self.first_failure is None:  # the first one is the cause
                self.first_failure = self.failure = exc

    def failed(self) -> bool:
        """A save failed (reported or not): the run must stop."""
        with self._idle:
            return self._failed

    def raise_if_failed(self) -> None:
        """Raise the first failure, once."""
        with self._idle:
            failure, self.failure = self.failure, None
        if failure is not None:
            raise failure

    def drain(self) -> None:
        """Block until every submitted save is committed (or failed) and its retention
        done; raise a failure."""
        with self._idle:
            self._idle.wait_for(lambda: self._pending == 0)
        self.raise_if_failed()

    def wait_committed(self) -> None:
        """Block until every submitted save is committed (or failed); raise a failure."""
        with self._idle:
            self._idle.wait_for(lambda: self._unsettled == 0)
        self.raise_if_failed()

    def close(self) -> None:
        try:
            self.drain()
        finally:
            self._jobs.put(None)
            self._thread.join()
