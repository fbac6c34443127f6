"""The thread that finishes asynchronous saves while training goes on.

Jobs run one after another in submission order, so commits (and `latest`) advance in
step order. A failure is kept and raised on the training thread at its next step
boundary (`raise_if_failed`), at `drain`, or at the next save: never silently dropped.
"""
from __future__ import annotations

import logging
import queue
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
        self._pending_dirs: list[str] = []
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="baton-ckpt-saver", daemon=True)
        self._thread.start()

    def submit(self, job: SaveJob) -> None:
        with self._idle:
            self._pending += 1
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
            try:
                final = self.runner.run(job)
                self._on_done(job, final, time.perf_counter() - job.started)
            except CheckpointWriteFailed as exc:
                self.failure = exc
            except BaseException as exc:  # noqa: BLE001 - surfaced on the training thread
                log.exception("background checkpoint save of step %d failed", job.step)
                self.failure = exc
            finally:
                if job.slot is not None:
                    self._release(job.slot)
                with self._idle:
                    self._pending -= 1
                    self._pending_dirs.remove(job.tmp.name)
                    self._idle.notify_all()

    def raise_if_failed(self) -> None:
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise failure

    def drain(self) -> None:
        """Block until every submitted save is committed (or failed); raise a failure."""
        with self._idle:
            self._idle.wait_for(lambda: self._pending == 0)
        self.raise_if_failed()

    def close(self) -> None:
        try:
            self.drain()
        finally:
            self._jobs.put(None)
            self._thread.join()
