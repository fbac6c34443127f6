"""Host memory a save needs beyond the training state: resident set sampled every few ms.

The process counts whole (VmRSS: heap, mapped files, shared memory it touched); child
processes (a method's background writer) count only the pages no other process maps
(Private_Clean + Private_Dirty): shared-memory staging is already counted in the parent
that filled it, and a forked child's copy-on-write pages are the parent's until written.
"""
from __future__ import annotations

import ctypes
import gc
import os
import threading

PAGE = os.sysconf("SC_PAGE_SIZE")
INTERVAL_S = 0.003


def own_rss() -> int:
    with open("/proc/self/statm", "rb") as handle:
        return int(handle.read().split()[1]) * PAGE


def private_rss(pid: int) -> int:
    """Resident bytes only process `pid` maps; 0 once it is gone."""
    total = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as handle:
            for line in handle:
                if line.startswith((b"Private_Clean:", b"Private_Dirty:")):
                    total += int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return 0
    return total


def total_rss(children: list[int]) -> int:
    return own_rss() + sum(private_rss(pid) for pid in children)


def settle() -> None:
    """Return freed memory to the system before a baseline is taken, so one method's
    garbage is neither charged to the next nor hidden in the allocator's free lists."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the baseline is merely noisier
        pass


class PeakSampler:
    """`with PeakSampler(children) as peak: ...` then `peak.extra`: the highest resident
    total seen inside the block minus the total at its start (never negative)."""

    def __init__(self, children: list[int] | None = None):
        self.children = list(children or [])
        self.baseline = self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-rss", daemon=True)

    def _sample(self) -> None:
        self.peak = max(self.peak, total_rss(self.children))

    def _run(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            self._sample()

    def __enter__(self) -> "PeakSampler":
        self.baseline = self.peak = total_rss(self.children)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    @property
    def extra(self) -> int:
        return max(self.peak - self.baseline, 0)
