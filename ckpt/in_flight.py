"""The book of asynchronous saves in flight, kept on the training process's side.

Whoever finishes the saves (the saver thread, ckpt.background_saver, or the saver
process, ckpt.saver_process) reports each one here; the training thread asks here
whether one failed, and waits here for them. The first failure is kept and raised on
the training thread at its next step boundary (`raise_if_failed`), at `drain`, or at the
next save: never silently dropped. A save counts as settled once committed (or failed)
and as finished once its retention is done too: `wait_committed` waits for the first,
`drain` for the second.
"""
from __future__ import annotations

import threading

from ckpt.save_job import SaveJob


class InFlightSaves:
    def __init__(self):
        self._idle = threading.Condition()
        self._pending = 0
        self._unsettled = 0
        """Submitted saves neither committed nor failed yet."""
        self._pending_dirs: list[str] = []
        self.failure: BaseException | None = None
        """The first failure, until raised on the training thread."""
        self.first_failure: BaseException | None = None
        self._failed = False

    def _submitted(self, job: SaveJob) -> None:
        with self._idle:
            self._pending += 1
            self._unsettled += 1
            self._pending_dirs.append(job.tmp.name)

    def in_flight(self) -> set[str]:
        """Names of the `.tmp` directories of saves not yet committed or failed."""
        with self._idle:
            return set(self._pending_dirs)

    def _settle(self) -> None:
        with self._idle:
            self._unsettled -= 1
            self._idle.notify_all()

    def _finished(self, job: SaveJob) -> None:
        with self._idle:
            self._pending -= 1
            self._pending_dirs.remove(job.tmp.name)
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
