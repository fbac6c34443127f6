"""The bound and the I/O floor of a checkpoint-every-step run (bench.every_step): the
state's bytes written to one file and fsynced after every step, one write in flight.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from bench.methods.bounds import write_and_fsync


class RawWriteEveryStep:
    """The bound: copy the state's bytes into one reused buffer (the step waits for that),
    then write them to one file and fsync it on a background thread, one in flight.
    `copy=False`: the I/O floor, the buffer filled once and only written every step."""

    def __init__(self, state, directory: Path, copy: bool = True):
        self.tensors = [t.detach() for t in state.tensors()]
        sizes = [t.numel() * t.element_size() for t in self.tensors]
        self.buffer = torch.empty(sum(sizes), dtype=torch.uint8)
        self.views = list(torch.split(self.buffer, sizes))
        # Byte views of the live tensors, made once (the optimizer updates them in place, as
        # `self.tensors` already assumes): one foreach call then copies them all, the
        # cheapest copy torch offers from Python, so the bound is not inflated by a loop.
        contiguous = all(t.is_contiguous() for t in self.tensors)
        self.sources = [t.reshape(-1).view(torch.uint8) for t in self.tensors] if contiguous else None
        self.copy = copy
        if not copy:  # the same bytes as the bound writes, copied once
            self._copy_state()
        name = "raw-every-step.bin" if copy else "raw-every-step-no-copy.bin"
        self.path = Path(directory) / name
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.writer = ThreadPoolExecutor(1, thread_name_prefix="bench-raw-write")
        self.pending = None

    def save(self) -> None:
        self.drain()  # one in flight, as baton's ckpt.max_in_flight=1
        if self.copy:
            self._copy_state()
        self.pending = self.writer.submit(self._write)

    def _copy_state(self) -> None:
        if self.sources is not None:
            torch._foreach_copy_(self.views, self.sources)
            return
        for view, tensor in zip(self.views, self.tensors):
            view.copy_(tensor.reshape(-1).view(torch.uint8))

    def _write(self) -> None:
        write_and_fsync(self.path, [memoryview(self.buffer.numpy())])

    def drain(self) -> None:
        if self.pending is not None:
            self.pending, pending = None, self.pending
            pending.result()

    def close(self) -> None:
        self.drain()
        self.writer.shutdown()
        self.path.unlink(missing_ok=True)
