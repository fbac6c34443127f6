"""CPU seconds of each thread of this process and of its child processes, read from /proc.

An every-step save costs the training step through more than the save call: the lazy
copier, the saver process's sender and listener (or the saver thread) run Python in the
training process beside the step, and the saver process takes CPU on the other core.
`python -m experiments.save_profile` reports each per save from two readings of this module's
`CpuReading`, taken around a block of steps without a profiler.

/proc counts CPU in clock ticks (1/SC_CLK_TCK s, 10 ms on Linux here), so a reading is
worth quoting only over blocks long enough for every thread of interest to use many.
"""
from __future__ import annotations

import os
import threading
from collections import Counter
from dataclasses import dataclass, field

from core.processes import parent_of

_TICKS = os.sysconf("SC_CLK_TCK")


def _user_system_s(stat_path: str) -> tuple[float, float] | None:
    """utime and stime of one /proc stat file; None when the thread or process is gone."""
    try:
        with open(stat_path) as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(fields[11]) / _TICKS, int(fields[12]) / _TICKS  # fields 14 and 15 of proc(5)


def _children(parent: int) -> list[int]:
    return [int(entry) for entry in os.listdir("/proc")
            if entry.isdigit() and parent_of(int(entry)) == parent]


@dataclass
class CpuReading:
    threads: Counter = field(default_factory=Counter)
    """Thread name (Python's, else the kernel's) -> CPU seconds; threads of one name add up."""
    children: float = 0.0
    """CPU seconds of this process's live child processes (the saver process)."""
    children_system: float = 0.0
    """Of which in the kernel (writes into the page cache, fsync, renames, deletions)."""

    @classmethod
    def now(cls) -> "CpuReading":
        names = {thread.native_id: thread.name for thread in threading.enumerate()}
        reading = cls()
        for tid in os.listdir("/proc/self/task"):
            times = _user_system_s(f"/proc/self/task/{tid}/stat")
            if times is None:
                continue
            name = names.get(int(tid))
            if name is None:
                try:
                    with open(f"/proc/self/task/{tid}/comm") as comm:
                        name = comm.read().strip()
                except FileNotFoundError:
                    continue
            reading.threads[name] += sum(times)
        for pid in _children(os.getpid()):
            times = _user_system_s(f"/proc/{pid}/stat")
            if times is not None:
                reading.children += sum(times)
                reading.children_system += times[1]
        return reading

    def since(self, before: "CpuReading", per: int) -> dict:
        """CPU seconds per unit (`per` steps) between `before` and this reading: by thread,
        the threads that used any, largest first; and the child processes'."""
        used = {name: (seconds - before.threads.get(name, 0.0)) / per
                for name, seconds in self.threads.items()}
        return {"threads": dict(sorted(((n, s) for n, s in used.items() if s > 0),
                                       key=lambda item: -item[1])),
                "children": max(self.children - before.children, 0.0) / per,
                "children_system": max(self.children_system - before.children_system, 0.0) / per}
