"""Staging copies that run while the next step's forward and backward run (`ckpt.snapshot=lazy`).

Forward and backward only read the weights and the optimizer state; only the optimizer
step writes them. So the copy into the staging pool need not block the save call: the
training thread records which storage goes into which staging buffer, a copier thread
copies them, and the next optimizer step waits until the copies have landed (a global
optimizer-step pre-hook, so no call site can forget it). The step therefore waits only
for whatever part of the copy the forward and backward did not hide, which is what
DataStates-LLM's lazy snapshots do.

The copies use tensor `copy_`, which releases the GIL (a storage's `copy_` holds it), so
the training thread keeps running Python while they run. They go in pieces of COPY_PIECE
bytes and count what landed per buffer (`CopyBatch.progress`), so the writer can write
each piece as soon as it is copied (ckpt.writers.gate) instead of after the whole copy.
"""
from __future__ import annotations

import queue
import threading
import time

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from ckpt.file_image import as_bytes
from ckpt.writers.gate import CopyProgress, SegmentGate

COPY_PIECE = 32 << 20
"""Bytes copied between two progress marks: small enough that the writer starts early,
large enough that the marks cost nothing next to the copy."""


def _as_bytes(buffer) -> torch.Tensor:
    return buffer if isinstance(buffer, torch.Tensor) else as_bytes(buffer)


class CopyBatch:
    """The copies of one save: (staged buffer, live storage) pairs, done once `done` is set.
    Either side is a storage or a kept uint8 view of one (ckpt.staging: Slot.views for the
    buffers, StagingPool._live_view for the live storages)."""

    def __init__(self, pairs: list[tuple[object, torch.UntypedStorage]]):
        self.pairs = pairs
        self.staged = [dst for dst, _ in pairs]
        self.progress = CopyProgress(len(pairs))
        self._index_of: dict[int, int] | None = None
        self.done = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            targets = [_as_bytes(dst) for dst, _ in self.pairs]
            for first, last in self._runs():
                if last - first > 1:  # many small storages: one call, one progress mark
                    torch._foreach_copy_(targets[first:last],
                                         [_as_bytes(src) for _, src in self.pairs[first:last]])
                    self.progress.advance_many(first, [t.numel() for t in targets[first:last]])
                    continue
                target, source = targets[first], _as_bytes(self.pairs[first][1])
                nbytes = target.numel()
                for start in range(0, nbytes, COPY_PIECE):
                    end = min(start + COPY_PIECE, nbytes)
                    target[start:end].copy_(source[start:end])
                    self.progress.advance(first, end)
        except BaseException as exc:  # noqa: BLE001 - re-raised where the copies are awaited
            self.error = exc
            self.progress.fail()
        finally:
            self.pairs = []  # the live storages are no longer needed
            self.done.set()

    def _runs(self) -> list[tuple[int, int]]:
        """[first, last) ranges of pairs copied together: consecutive storages that add up
        to at most COPY_PIECE go in one GIL-free foreach call (a tiny model's 84 storages
        cost the copier thread milliseconds of Python one by one); a larger one alone."""
        runs, first, held = [], 0, 0
        for index, (dst, _) in enumerate(self.pairs):
            nbytes = dst.numel() if isinstance(dst, torch.Tensor) else dst.nbytes()
            if index > first and held + nbytes > COPY_PIECE:
                runs.append((first, index))
                first, held = index, 0
            held += nbytes
        if first < len(self.pairs):
            runs.append((first, len(self.pairs)))
        return runs

    def wait(self) -> float:
        """Block until the copies landed; returns the seconds waited, raises their failure."""
        if self.done.is_set():
            waited = 0.0
        else:
            started = time.perf_counter()
            self.done.wait()
            waited = time.perf_counter() - started
        if self.error is not None:
            raise RuntimeError("staging copy of a checkpoint failed") from self.error
        return waited

    def gate(self, segments: list[tuple[int, object]]) -> SegmentGate:
        """For a file's (offset, buffer) segments: which of these copies each one waits for
        (-1: a piece the pickler wrote, or a buffer of no copy of this batch)."""
        if self._index_of is None:  # once per save, not once per file
            self._index_of = {staged.data_ptr(): index for index, staged in enumerate(self.staged)}
        index_of = self._index_of
        sources = [index_of.get(buffer.data_ptr(), -1) if isinstance(buffer, torch.Tensor) else -1
                   for _, buffer in segments]
        return SegmentGate(self.progress, sources)


class Copier:
    """One thread running batches in submission order."""

    def __init__(self):
        self._batches: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="baton-ckpt-copier", daemon=True)
        self._thread.start()

    def submit(self, batch: CopyBatch) -> None:
        self._batches.put(batch)

    def _loop(self) -> None:
        while True:
            batch = self._batches.get()
            if batch is None:
                return
            batch.run()

    def close(self) -> None:
        self._batches.put(None)
        self._thread.join()


class UpdateGuard:
    """Holds every optimizer step of this process until the outstanding copies landed.

    `hold(batch, on_wait)` registers a batch; the next optimizer step (any optimizer: the
    pre-hook is global) waits for it and reports the seconds it waited to `on_wait`, which
    counts them as that save's stall. `wait_all()` does the same outside an optimizer step.
    """

    def __init__(self):
        self._held: list[tuple[CopyBatch, object]] = []
        self._lock = threading.Lock()
        self._handle = register_optimizer_step_pre_hook(self._before_step)

    def hold(self, batch: CopyBatch, on_wait) -> None:
        with self._lock:
            self._held.append((batch, on_wait))

    def wait_all(self) -> float:
        with self._lock:
            held, self._held = self._held, []
        total = 0.0
        for batch, on_wait in held:
            waited = batch.wait()
            on_wait(waited)
            total += waited
        return total

    def _before_step(self, optimizer, args, kwargs) -> None:
        self.wait_all()

    def close(self) -> None:
        self.wait_all()
        self._handle.remove()
