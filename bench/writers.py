"""Native vs Python writer on the same segments: `baton bench ckpt`'s writer line.

Both write the same checkpoint-like layout (large storage buffers separated by small
record headers), interleaved round by round, the order alternating, each write timed from
open to fsync. The digests of every round must agree, so a fast wrong writer cannot win.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time

import numpy as np

from ckpt.content_hash import CHUNK_BYTES, DEFAULT_THREADS
from ckpt.writers.native import NativeWriter, load_extension
from ckpt.writers.python_writer import PythonWriter

HEADER_BYTES = 192  # about what torch's zip format puts before each storage record
WRITERS_BYTES = 256 << 20
"""What `baton bench ckpt` writes with each writer: large enough for the per-MiB costs to
dominate, small enough to take seconds."""


def checkpoint_like_segments(size_bytes: int, seed: int = 0) -> list[tuple[int, object]]:
    """Storages of 1-64 MiB (views of one random pool) separated by small header bytes."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size_bytes, dtype=np.uint8)
    segments, pos = [], 0
    while pos < size_bytes:
        header = min(HEADER_BYTES, size_bytes - pos)
        segments.append((pos, data[pos:pos + header].tobytes()))
        pos += header
        storage = min(int(rng.integers(1 << 20, 64 << 20)), size_bytes - pos)
        if storage:
            segments.append((pos, data[pos:pos + storage]))
            pos += storage
    return segments


def bench_writers(size_bytes: int, rounds: int = 3, *, directory: str | None = None,
                  chunk_bytes: int = CHUNK_BYTES, threads: int = DEFAULT_THREADS,
                  direct: bool = False, fsync: bool = True) -> dict:
    """Seconds per file write (min, median) for each writer, and python/native ratios."""
    if rounds < 3:
        raise ValueError(f"rounds must be >= 3 for a min and a median that mean something, "
                         f"got {rounds}")
    extension, reason = load_extension()
    writers = [PythonWriter()] + ([NativeWriter(extension)] if extension else [])
    segments = checkpoint_like_segments(size_bytes)
    times = {w.name: [] for w in writers}
    with tempfile.TemporaryDirectory(prefix="baton-writers-", dir=directory) as tmp:
        for r in range(rounds):
            digests = {}
            for writer in writers[::-1] if r % 2 else writers:
                path = os.path.join(tmp, f"{writer.name}.bin")
                start = time.perf_counter()
                digests[writer.name] = writer.write_file(
                    path, size_bytes, segments, chunk_bytes=chunk_bytes, threads=threads,
                    direct=direct, fsync=fsync)
                times[writer.name].append(time.perf_counter() - start)
                os.unlink(path)
            if len(set(map(tuple, digests.values()))) != 1:
                raise RuntimeError(f"writers disagree on the digests of round {r}")
    result = {"bytes": size_bytes, "rounds": rounds, "chunk_bytes": chunk_bytes,
              "threads": threads, "direct": direct, "fsync": fsync,
              "native_unavailable": reason, "native": None}
    for name, values in times.items():
        result[name] = {"min_s": min(values), "median_s": statistics.median(values),
                        "times_s": values}
    if result["native"] is not None:
        for stat in ("min_s", "median_s"):
            result[f"python_over_native_{stat[:-2]}"] = result["python"][stat] / result["native"][stat]
    return result


def writer_gain(state_bytes: int, rounds: int, directory: str | None) -> dict:
    """The writers' comparison for `baton bench ckpt`, plus which one `ckpt.writer=auto`
    (the default) uses on this machine."""
    result = bench_writers(min(WRITERS_BYTES, state_bytes), rounds, directory=directory)
    result["default"] = "python" if result["native_unavailable"] else "native"
    return result
