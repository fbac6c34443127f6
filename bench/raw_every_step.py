"""The bound and the I/O floor of a checkpoint-every-step run (bench.every_step): the
state's bytes written to one file and fsynced after every step, one write in flight.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.methods.bounds import write_and_fsync
from bench.state_copy import StateCopy


class RawWriteEveryStep:
    """The bound: copy the state's bytes into one reused buffer (the step waits for that),
    then write them to one file and fsync it on a background thread, one in flight.
    `copy=False`: the I/O floor, the buffer filled once and only written every step."""

    def __init__(self, state, directory: Path, copy: bool = True):
        self.copier = StateCopy(state)
        self.copy = copy
        if not copy:  # the same bytes as the bound writes, copied once
            self.copier.copy()
        name = "raw-every-step.bin" if copy else "raw-every-step-no-copy.bin"
        self.path = Path(directory) / name
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.writer = ThreadPoolExecutor(1, thread_name_prefix="bench-raw-write")
        self.pending = None

    def save(self) -> None:
        self.drain()  # one in flight, as baton's ckpt.max_in_flight=1
        if self.copy:
            self.copier.copy()
        self.pending = self.writer.submit(self._write)

    def _write(self) -> None:
        write_and_fsync(self.path, [memoryview(self.copier.buffer.numpy())])

    def drain(self) -> None:
        if self.pending is not None:
            self.pending, pending = None, self.pending
            pending.result()

    def close(self) -> None:
        try:
            self.drain()
        finally:  # a failed last write still stops the thread and removes the file
            self.writer.shutdown()
            self.path.unlink(missing_ok=True)
