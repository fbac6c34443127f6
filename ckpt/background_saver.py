"""The thread that finishes asynchronous saves while training goes on (`ckpt.saver=thread`).

Jobs run one after another in submission order, so commits (and `latest`) advance in
step order. Failures go to the book (ckpt.in_flight), which raises them on the training
thread. Saves queued behind a failed one are discarded, not committed.

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
from ckpt.in_flight import InFlightSaves
from ckpt.save_job import SaveJob, SaveRunner

log = logging.getLogger(__name__)


class BackgroundSaver(InFlightSaves):
    def __init__(self, runner: SaveRunner, release_slot, on_done):
        super().__init__()
        self.runner, self._release, self._on_done = runner, release_slot, on_done
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="baton-ckpt-saver", daemon=True)
        self._thread.start()

    def submit(self, job: SaveJob) -> None:
        self._submitted(job)
        self._jobs.put(job)

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            settled = False
            try:
                if self.failed():
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
                self._finished(job)

    def close(self) -> None:
        try:
            self.drain()
        finally:
            self._jobs.put(None)
            self._thread.join()
