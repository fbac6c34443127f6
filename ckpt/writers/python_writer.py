"""The pure-Python writer: the reference twin of csrc/native_writer.cpp.

Same plan as the native one (see its header): worker threads take whole chunks, write
each part in PIECE_BYTES pieces with os.pwrite and hash it with hashlib, then start the
chunk's writeback with sync_file_range. Both os.pwrite and hashlib (above 2 KiB) release
the GIL, so two threads do overlap; what the native writer saves is the interpreter
between the calls.
"""
from __future__ import annotations

import bisect
import ctypes
import errno
import functools
import os
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import numpy as np

from ckpt.content_hash import chunk_ranges
from ckpt.content_hash import ALG, hasher_for
from ckpt.writers.base import ALIGN, PIECE_BYTES
from ckpt.writers.gate import SegmentGate
from ckpt.writers.segments import check_arguments, checked_views

SYNC_FILE_RANGE_WRITE = 2


class PythonWriter:
    name = "python"

    def write_file(self, path, size: int, segments: Sequence[tuple[int, object]], *,
                   chunk_bytes: int, threads: int, direct: bool = False,
                   fsync: bool = True, alg: str = ALG, gate: SegmentGate | None = None) -> list[str]:
        check_arguments(size, chunk_bytes, threads)
        new_hasher = hasher_for(alg)
        views = checked_views(size, segments)
        if gate is not None:
            gate.check(len(views))
        path = os.fspath(path)
        try:
            return _write(path, size, views, chunk_bytes, threads, direct, fsync, new_hasher, gate)
        except OSError as exc:
            if exc.filename is not None:
                raise
            raise OSError(exc.errno, exc.strerror, path) from exc


def _write(path, size, views, chunk_bytes, threads, direct, fsync, new_hasher, gate) -> list[str]:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    direct_fd = -1
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):  # a device such as /dev/full has no size
            os.ftruncate(fd, size)  # inside i_size, parallel O_DIRECT writes share a lock
        direct_fd = _open_direct(path) if direct else -1
        job = _FileJob(fd, direct_fd, views, chunk_ranges(size, chunk_bytes), new_hasher, gate)
        digests = job.run(threads)
        if fsync:
            os.fsync(fd)
    finally:
        if direct_fd >= 0:
            os.close(direct_fd)
        os.close(fd)
    return digests


def _open_direct(path: str) -> int:
    """An O_DIRECT descriptor, or -1 where the filesystem refuses O_DIRECT."""
    try:
        return os.open(path, os.O_WRONLY | os.O_DIRECT | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return -1
        raise


class _FileJob:
    """One file's chunks, written by whichever thread takes each."""

    def __init__(self, fd: int, direct_fd: int, views, ranges, new_hasher, gate=None):
        self.fd, self.direct_fd, self.ranges, self.gate = fd, direct_fd, ranges, gate
        self.new_hasher = new_hasher
        self.views = views
        self.starts = [offset for offset, _ in views]
        self.addresses = [_address(v) for _, v in views] if direct_fd >= 0 else None
        self.failed = threading.Event()

    def run(self, threads: int) -> list[str]:
        workers = min(threads, len(self.ranges))
        if workers == 1:
            return [self.write_chunk(i) for i in range(len(self.ranges))]
        with ThreadPoolExecutor(workers, thread_name_prefix="baton-write") as pool:
            return list(pool.map(self.write_chunk, range(len(self.ranges))))

    def write_chunk(self, index: int) -> str | None:
        if self.failed.is_set():
            return None  # another chunk failed: its error is the one raised
        try:
            return self._write_chunk(*self.ranges[index])
        except BaseException:
            self.failed.set()
            raise

    def _write_chunk(self, start: int, end: int) -> str:
        sha = self.new_hasher()
        first = max(0, bisect.bisect_right(self.starts, start) - 1)
        for i in range(first, len(self.views)):
            seg_offset, view = self.views[i]
            if seg_offset >= end:
                break
            lo, hi = max(seg_offset, start), min(seg_offset + view.nbytes, end)
            for pos in range(lo, hi, PIECE_BYTES):
                n = min(PIECE_BYTES, hi - pos)
                piece = view[pos - seg_offset:pos - seg_offset + n]
                if self.gate is not None:  # the copy into this buffer may still be running
                    self.gate.wait(i, pos - seg_offset + n)
                self._write_piece(piece, pos, i)
                sha.update(piece)
        if end > start:
            _start_writeback(self.fd, start, end - start)
        return sha.hexdigest()

    def _write_piece(self, piece: memoryview, pos: int, segment: int) -> None:
        direct_fd = self.direct_fd
        if direct_fd >= 0 and _aligned(pos, self.addresses[segment] + pos - self.starts[segment],
                                       piece.nbytes):
            try:
                return _pwrite_all(direct_fd, piece, pos)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self.direct_fd = -1  # the filesystem refused O_DIRECT after all: buffered
        _pwrite_all(self.fd, piece, pos)


def _aligned(offset: int, address: int, length: int) -> bool:
    return offset % ALIGN == 0 and address % ALIGN == 0 and length % ALIGN == 0


def _address(view: memoryview) -> int:
    return np.frombuffer(view, dtype=np.uint8).ctypes.data


def _pwrite_all(fd: int, piece: memoryview, pos: int) -> None:
    while piece.nbytes:
        n = os.pwrite(fd, piece, pos)
        if n == 0:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        piece, pos = piece[n:], pos + n


def _start_writeback(fd: int, offset: int, length: int) -> None:
    """A hint only: a failure here would show again at fsync, which reports it."""
    sync_file_range = _sync_file_range()
    if sync_file_range is not None:
        sync_file_range(fd, offset, length, SYNC_FILE_RANGE_WRITE)


@functools.cache
def _sync_file_range():
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn
