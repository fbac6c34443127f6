"""The writer contract: one checkpoint file from (offset, buffer) segments, hashed per chunk.

Two backends implement it with the same rules and give the same bytes and digests:
`native` (csrc/native_writer.cpp, threads without the GIL) and `python` (its twin).
"""
from __future__ import annotations

from typing import Protocol, Sequence

ALIGN = 4096
"""O_DIRECT needs the file offset, the buffer address and the length aligned to this."""

PIECE_BYTES = 1 << 20
"""Inside a chunk, each segment part is written then hashed in pieces of this size, so the
hash reads bytes that the write just brought into cache."""


class Writer(Protocol):
    name: str  # "native" or "python"

    def write_file(self, path: str, size: int, segments: Sequence[tuple[int, object]], *,
                   chunk_bytes: int, threads: int, direct: bool = False,
                   fsync: bool = True, alg: str = "sha256",
                   gate=None) -> list[str]:
        """Create/truncate `path`, write every (offset, buffer) segment from `threads`
        threads, hash each chunk of `chunk_bytes` of the final bytes with sha256
        (ckpt.content_hash chunking), start writeback per chunk, fsync when `fsync`, and
        return the chunk hex digests in order.

        `segments` are sorted and contiguous, covering [0, size) exactly (ValueError
        otherwise); a buffer is anything with the buffer protocol or a contiguous CPU
        torch Tensor / UntypedStorage. With `direct`, pieces whose offset, address and
        length are ALIGN-aligned go through an O_DIRECT descriptor (buffered where the
        filesystem refuses it). With a `gate` (ckpt.writers.gate.SegmentGate), each piece
        is written only once the copy filling its buffer has passed it, and a failed copy
        raises OSError(ECANCELED). Errors raise OSError with errno and filename=path."""
        ...
