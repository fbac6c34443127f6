"""Bounds on the same bytes: no checkpoint method can stall less than a copy of the state
into buffers it already has, nor make the bytes durable faster than the disk takes them."""
from __future__ import annotations

import os
import shutil
import subprocess

import torch

from bench.methods.base import SaveMethod, Unavailable

MEMCPY = "memcpy (bound)"
WRITE_PYTHON = "write + fsync (bound)"
WRITE_DD = "dd conv=fsync (bound)"
SLICE = 64 << 20  # one os.write call stays far below Linux's 2 GiB per-call limit


def raw_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes without a copy (the state's tensors are contiguous)."""
    flat = tensor.detach().reshape(-1).view(torch.uint8)
    return memoryview(flat.numpy())


def write_and_fsync(path, views) -> None:
    """Write the byte views one after another to `path` in SLICE-sized calls, then fsync."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for view in views:
            for start in range(0, view.nbytes, SLICE):
                piece = view[start:start + SLICE]
                while piece.nbytes:
                    piece = piece[os.write(fd, piece):]
        os.fsync(fd)
    finally:
        os.close(fd)


class MemcpyBound(SaveMethod):
    name = MEMCPY
    bound = True

    def prepare(self, state, directory) -> None:
        super().prepare(state, directory)
        self.sources = state.tensors()
        self.buffers = [torch.empty_like(t) for t in self.sources]

    def save(self) -> None:
        for buffer, source in zip(self.buffers, self.sources):
            buffer.copy_(source)

    def saved_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers)

    def cleanup(self) -> None:
        pass

    def close(self) -> None:
        self.buffers = self.sources = []


class PythonWriteBound(SaveMethod):
    """The state's own bytes, one sequential file, written in large slices, then fsync."""

    name = WRITE_PYTHON
    bound = True

    def prepare(self, state, directory) -> None:
        super().prepare(state, directory)
        self.sources = state.tensors()

    def save(self) -> None:
        write_and_fsync(self.next_path(), (raw_bytes(tensor) for tensor in self.sources))

    def close(self) -> None:
        self.sources = []


class DdWriteBound(SaveMethod):
    """`dd if=/dev/zero conv=fsync` of the same byte count: the disk without Python."""

    name = WRITE_DD
    bound = True

    def prepare(self, state, directory) -> None:
        super().prepare(state, directory)
        self.dd = shutil.which("dd")
        if self.dd is None:
            raise Unavailable("no dd on PATH")
        self.nbytes = state.nbytes()

    def save(self) -> None:
        subprocess.run([self.dd, "if=/dev/zero", f"of={self.next_path()}", "bs=16M",
                        f"count={self.nbytes}", "iflag=count_bytes", "conv=fsync",
                        "status=none"], check=True, capture_output=True)

BOUND_NAMES = (MEMCPY, WRITE_PYTHON, WRITE_DD)
