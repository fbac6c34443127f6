"""Staging buffers the saver process maps too (`ckpt.saver=process`).

Each buffer is its own memfd (anonymous shared memory, not bound by the size of
/dev/shm), mapped here as a uint8 tensor. Its file descriptor goes once to the saver
process (ckpt.saver_process sends it over their socket), which maps the same pages: the
training process copies the state into them, the saver reads them, and nothing is
copied between the two. mmap's pages are page-aligned, so O_DIRECT can write them.

A buffer lives as long as the pool that made it. Each descriptor is closed once sent
(both mappings keep the memory), so a worker holds none for long. A buffer the pool drops
(a file a save no longer has, a storage of another size) is dropped by the saver too: its
id goes over with the next save (`take_dropped`), and the saver forgets its mapping, so
the memory is freed once neither process maps it.
"""
from __future__ import annotations

import mmap
import os
import threading

import torch


class SharedBuffers:
    def __init__(self):
        self._lock = threading.Lock()
        self._by_address: dict[int, int] = {}
        """data_ptr -> buffer id."""
        self._fds: dict[int, int] = {}
        """buffer id -> its memfd."""
        self._sizes: dict[int, int] = {}
        self._unsent: list[int] = []
        self._dropped: list[int] = []
        """Ids of sent buffers the pool dropped, not yet told to the saver."""
        self._next = 0

    def allocate(self, nbytes: int) -> torch.Tensor:
        """A zero-filled uint8 tensor of `nbytes` in shared memory (nbytes > 0)."""
        fd = os.memfd_create("baton-staging", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, nbytes)
            mapped = mmap.mmap(fd, nbytes)
        except BaseException:
            os.close(fd)
            raise
        buffer = torch.frombuffer(mapped, dtype=torch.uint8)  # holds `mapped` alive
        with self._lock:
            ident, self._next = self._next, self._next + 1  # ids are never reused
            self._by_address[buffer.data_ptr()] = ident
            self._fds[ident], self._sizes[ident] = fd, nbytes
            self._unsent.append(ident)
        return buffer

    def ident(self, address: int, nbytes: int) -> int:
        """The id of the buffer a staged storage starts at (a ValueError for anything
        else: only staging buffers travel to the saver process)."""
        with self._lock:
            ident = self._by_address.get(address)
            if ident is None or nbytes > self._sizes[ident]:
                raise ValueError(f"a storage of {nbytes} bytes at {address:#x} is not a "
                                 "shared staging buffer")
            return ident

    def drop(self, address: int) -> None:
        """The pool let go of the buffer at `address`: the saver process is told to let go
        of it too, unless it never got it (its descriptor is closed here instead)."""
        with self._lock:
            ident = self._by_address.pop(address, None)
            if ident is None:
                return
            del self._sizes[ident]
            if ident in self._unsent:
                self._unsent.remove(ident)
                os.close(self._fds.pop(ident))
            else:
                self._dropped.append(ident)

    def take_dropped(self) -> list[int]:
        """Ids of the sent buffers dropped since the last call."""
        with self._lock:
            dropped, self._dropped = self._dropped, []
            return dropped

    def take_unsent(self) -> list[tuple[int, int, int]]:
        """(id, nbytes, fd) of the buffers allocated since the last call. The caller owns
        each fd now and closes it once sent: the mappings keep the memory, and a model
        with many tensors would otherwise hold one descriptor per buffer."""
        with self._lock:
            unsent, self._unsent = self._unsent, []
            return [(ident, self._sizes[ident], self._fds.pop(ident)) for ident in unsent]

    def close(self) -> None:
        """Close the descriptors (the mappings stay valid while tensors use them)."""
        with self._lock:
            fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)
