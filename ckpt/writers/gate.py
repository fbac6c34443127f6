"""Writing a file while its buffers are still being filled: per-buffer progress a writer waits on.

A lazy save's staging copies (ckpt.deferred_copy) used to finish before the writer wrote
a byte, so the time until durable was the copy plus the write. Both writers instead take
a `SegmentGate`: before writing a piece of a segment they wait until the copy of that
segment's buffer has passed the piece's end, so writing follows the copy a piece behind.

The progress lives in a numpy int64 array (`CopyProgress.landed`), one cell per buffer
plus a last cell set when the copy failed. The copier stores into it after each copied
piece; the Python twin waits on a condition variable, the native writer reads the cells
with acquire loads without the GIL (aligned 8-byte stores are atomic on the CPUs torch
supports). A failed copy makes every waiting writer raise OSError(ECANCELED) at once.
"""
from __future__ import annotations

import errno
import os
import threading
from dataclasses import dataclass

import numpy as np


class CopyProgress:
    """Bytes landed so far in each of `count` buffers, and whether the copy failed."""

    def __init__(self, count: int):
        self.landed = np.zeros(count + 1, dtype=np.int64)
        self._changed = threading.Condition()

    @property
    def count(self) -> int:
        return len(self.landed) - 1

    def advance(self, index: int, nbytes: int) -> None:
        """Buffer `index` holds its first `nbytes` bytes (call after they were written)."""
        with self._changed:
            self.landed[index] = nbytes
            self._changed.notify_all()

    def advance_many(self, first: int, sizes: list[int]) -> None:
        """Buffers first, first+1, ... hold all of their `sizes` bytes."""
        with self._changed:
            self.landed[first:first + len(sizes)] = sizes
            self._changed.notify_all()

    def fail(self) -> None:
        with self._changed:
            self.landed[-1] = 1
            self._changed.notify_all()

    def failed(self) -> bool:
        return bool(self.landed[-1])

    def wait(self, index: int, nbytes: int) -> None:
        """Block until buffer `index` holds `nbytes` bytes; OSError(ECANCELED) if the copy failed."""
        with self._changed:
            self._changed.wait_for(lambda: self.landed[index] >= nbytes or self.landed[-1])
        if self.failed():
            raise OSError(errno.ECANCELED, f"{os.strerror(errno.ECANCELED)}: the staging copy failed")


@dataclass
class SegmentGate:
    """Which buffer of `progress` each segment of one file waits for (-1: ready now)."""

    progress: CopyProgress
    sources: np.ndarray
    """int64, one per segment, in segment order."""

    def __post_init__(self):
        self.sources = np.ascontiguousarray(self.sources, dtype=np.int64)
        if self.sources.ndim != 1 or (len(self.sources) and (
                self.sources.max() >= self.progress.count or self.sources.min() < -1)):
            raise ValueError(f"gate sources must index {self.progress.count} buffers or be -1, "
                             f"got {self.sources.tolist()[:8]}")

    def wait(self, segment: int, upto: int) -> None:
        """Before writing a segment's bytes [0, upto): wait until they landed."""
        source = int(self.sources[segment])
        if source >= 0:
            self.progress.wait(source, upto)

    def check(self, segments: int) -> None:
        if len(self.sources) != segments:
            raise ValueError(f"the gate names {len(self.sources)} segments, the file has {segments}")
