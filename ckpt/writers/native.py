"""The native writer: a thin typed facade over the `ckpt._native_writer` extension.

The extension (csrc/native_writer.cpp, built by setup.py at install) takes buffers only;
this side turns tensors and storages into byte views and checks the layout with the same
code as the Python twin, and keeps the views (and so the tensors) alive for the call.
"""
from __future__ import annotations

import functools
import os
from typing import Sequence

from ckpt.content_hash import ALG, hasher_for
from ckpt.writers.gate import SegmentGate
from ckpt.writers.segments import check_arguments, checked_views


@functools.cache
def load_extension():
    """(module, None) when the extension imports, else (None, why not in one line)."""
    try:
        from ckpt import _native_writer
    except ImportError as exc:
        return None, " ".join(f"{type(exc).__name__}: {exc}".split())
    return _native_writer, None


class NativeWriter:
    name = "native"

    def __init__(self, extension):
        self._extension = extension

    def write_file(self, path, size: int, segments: Sequence[tuple[int, object]], *,
                   chunk_bytes: int, threads: int, direct: bool = False,
                   fsync: bool = True, alg: str = ALG, gate: SegmentGate | None = None) -> list[str]:
        check_arguments(size, chunk_bytes, threads)
        hasher_for(alg)  # the same refusal of an unknown algorithm as the twin
        views = checked_views(size, segments)  # held here until the call returns
        landed = sources = None
        if gate is not None:
            gate.check(len(views))
            landed, sources = gate.progress.landed, gate.sources
        return self._extension.write_file(os.fspath(path), size, views, chunk_bytes,
                                          threads, direct, fsync, alg, landed, sources)
