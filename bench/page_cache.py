"""Evict files from the page cache, and count how much of them is still cached.

A node that restarts finds its run directory on disk, not in memory: a restore measured
right after the copy was written would read it from the page cache instead. Dropping the
whole cache needs root; `POSIX_FADV_DONTNEED` drops one file's clean pages without it,
so each file is fsynced first (dirty pages are not dropped). Whether that worked is
measured, not assumed: `mincore` over a mapping of the file says which pages are resident.
"""
from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

_MAP_FAILED = ctypes.c_void_p(-1).value


def files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file())


def evict(files: list[Path]) -> None:
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


def _resident_pages(libc, path: Path) -> tuple[int, int]:
    """(resident, total) pages of one file. Mapping it reads nothing: mincore only looks."""
    size = path.stat().st_size
    if size == 0:
        return 0, 0
    pages = -(-size // mmap.PAGESIZE)
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
        try:
            vector = (ctypes.c_ubyte * pages)()
            if libc.mincore(address, size, vector) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path} failed")
            resident = sum(1 for flag in bytes(vector) if flag & 1)
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)
    return resident, pages


def resident_fraction(files: list[Path]) -> float | None:
    """Fraction of the files' pages in the page cache; None if there is nothing to map."""
    libc = _libc()
    resident = total = 0
    for path in files:
        found, pages = _resident_pages(libc, path)
        resident, total = resident + found, total + pages
    return resident / total if total else None
