"""Content hashes of checkpoint files: a digest per fixed-size chunk, computed in parallel.

One whole-file digest is a single serial pass; a digest per chunk lets the writer hash
slices while it writes them, on several threads, and lets a reader check a file while
reading it. The manifest names the algorithm and the chunk size (`Manifest.hashing`),
so either can change without breaking old checkpoints.

Two algorithms, chosen by measurement (2-core AMD EPYC, 1 GiB in memory; the table is
in docs/async_checkpoints.md) and by what the manifest must prove:
- `xxh3-128` (0.10 s/GiB on one core) when manifests are not signed. It detects any
  corruption; collision resistance would buy nothing there, because whoever can change
  a file can change an unsigned manifest too. It is the default, so hashing costs a
  fraction of writing or reading the bytes.
- `sha256` (OpenSSL with SHA-NI: 0.70 s/GiB on one core, 0.36 s on two) when manifests
  are signed (ckpt.signing): a signature over the manifest binds the files only through
  a collision-resistant hash.
Both run in the Python twin (hashlib, xxhash) and the native writer (OpenSSL,
libxxhash), and both release the GIL, so threads hash in parallel.
"""
from __future__ import annotations

import hashlib
import mmap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import xxhash

SHA256, XXH3 = "sha256", "xxh3-128"
ALGS = {SHA256: hashlib.sha256, XXH3: xxhash.xxh3_128}
ALG = XXH3
CHUNK_BYTES = 16 << 20
DEFAULT_THREADS = 2


def hasher_for(alg: str):
    """The constructor of a hash object for `alg` (update / hexdigest)."""
    try:
        return ALGS[alg]
    except KeyError:
        raise ValueError(f"unknown content hash {alg!r}; expected one of {', '.join(ALGS)}") from None


def choose(requested: str, signed: bool) -> str:
    """ckpt.hash: `auto` is sha256 for signed manifests, xxh3-128 otherwise."""
    if requested == "auto":
        return SHA256 if signed else XXH3
    hasher_for(requested)
    return requested


def scheme(chunk_bytes: int = CHUNK_BYTES, alg: str = ALG) -> dict:
    """What `Manifest.hashing` records."""
    return {"alg": alg, "chunk_bytes": chunk_bytes}


def chunk_ranges(size: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """(start, end) of every chunk; an empty file has one empty chunk."""
    if size == 0:
        return [(0, 0)]
    return [(start, min(start + chunk_bytes, size)) for start in range(0, size, chunk_bytes)]


def digest(data, alg: str = SHA256) -> str:
    """The hex digest of one chunk (both libraries release the GIL on large inputs)."""
    return hasher_for(alg)(data).hexdigest()


def hash_chunks(data, chunk_bytes: int = CHUNK_BYTES, threads: int = DEFAULT_THREADS,
                pool: ThreadPoolExecutor | None = None, alg: str = ALG) -> list[str]:
    """Chunk digests of an in-memory buffer."""
    view = memoryview(data).cast("B")
    pieces = [view[a:b] for a, b in chunk_ranges(view.nbytes, chunk_bytes)]
    one = hasher_for(alg)
    work = lambda piece: one(piece).hexdigest()  # noqa: E731
    if threads <= 1 or len(pieces) == 1:
        return [work(p) for p in pieces]
    if pool is not None:
        return list(pool.map(work, pieces))
    with ThreadPoolExecutor(threads, thread_name_prefix="baton-hash") as own:
        return list(own.map(work, pieces))


# -- manifest entries ---------------------------------------------------------------
# A file's entry is {"size", "chunks": [hex, ...]} under the manifest's `hashing` scheme,
# or {"size", "sha256": hex} (one whole-file digest: checkpoints written before chunking,
# and adopted ones). Every reader goes through the functions below.

def entry(size: int, chunks: list[str]) -> dict:
    return {"size": size, "chunks": chunks}


def chunk_bytes_of(hashing: dict | None) -> int:
    return int((hashing or {}).get("chunk_bytes") or CHUNK_BYTES)


def alg_of(hashing: dict | None) -> str:
    return (hashing or {}).get("alg") or SHA256


def identity(file_entry: dict) -> str:
    """One string that is equal for two entries exactly when their recorded bytes are."""
    if "chunks" in file_entry:
        return f"{file_entry['size']}:" + ",".join(file_entry["chunks"])
    return f"{file_entry['size']}:{file_entry['sha256']}"


def well_formed(file_entry, hashing) -> bool:
    if not isinstance(file_entry, dict) or not isinstance(file_entry.get("size"), int):
        return False
    if "chunks" in file_entry:
        chunks = file_entry["chunks"]
        return (isinstance(hashing, dict) and hashing.get("alg") in ALGS
                and isinstance(hashing.get("chunk_bytes"), int) and hashing["chunk_bytes"] > 0
                and isinstance(chunks, list) and all(isinstance(c, str) for c in chunks)
                and len(chunks) == len(chunk_ranges(file_entry["size"], hashing["chunk_bytes"])))
    return isinstance(file_entry.get("sha256"), str)


def mismatch(file_entry: dict, hashing: dict | None, data) -> str | None:
    """None when `data` is what the entry records; else what differs, in words."""
    view = memoryview(data).cast("B")
    if view.nbytes != file_entry["size"]:
        return f"{view.nbytes} bytes read, {file_entry['size']} in the manifest"
    if "chunks" not in file_entry:
        actual = digest(view, SHA256)
        return None if actual == file_entry["sha256"] else (
            f"sha256 {actual[:16]}… read, {file_entry['sha256'][:16]}… in the manifest")
    actual = hash_chunks(view, chunk_bytes_of(hashing), alg=alg_of(hashing))
    return _first_bad_chunk(file_entry, hashing, actual)


def _first_bad_chunk(file_entry: dict, hashing: dict | None, actual: list[str]) -> str | None:
    for index, (got, want) in enumerate(zip(actual, file_entry["chunks"])):
        if got != want:
            start = index * chunk_bytes_of(hashing)
            return (f"chunk {index} (bytes {start}-{min(start + chunk_bytes_of(hashing), file_entry['size'])}) "
                    f"{alg_of(hashing)} {got[:16]}… read, {want[:16]}… in the manifest")
    return None


def read_checked(path, file_entry: dict, hashing: dict | None,
                 pool: ThreadPoolExecutor | None = None) -> tuple[np.ndarray, str | None]:
    """Read a file once into one buffer, hashing each chunk on `pool` while the next is read.
    Returns (bytes as a uint8 array, problem): problem is None when the bytes are what the
    entry records. Never reads more than the recorded size plus one byte.

    The buffer is not `bytearray(size)`: a bytearray is zero-filled first, which cost more
    than reading the file (0.42 s of 0.7 s for 0.5 GB here); see `read_buffer`."""
    size = file_entry["size"]
    step = chunk_bytes_of(hashing) if "chunks" in file_entry else 1 << 24
    buffer = read_buffer(size)
    view = memoryview(buffer)
    futures, got = [], 0
    with open(path, "rb", buffering=0) as handle:
        for start, end in chunk_ranges(size, step):
            while got < end and (n := handle.readinto(view[got:end])):
                got += n
            if got < end:
                break
            if "chunks" in file_entry and pool is not None:
                futures.append(pool.submit(digest, view[start:end], alg_of(hashing)))
        longer = got == size and handle.read(1)
    if got != size or longer:
        return buffer, (f"more than {size}" if longer else str(got)) + f" bytes read, {size} in the manifest"
    if "chunks" in file_entry and pool is not None:
        return buffer, _first_bad_chunk(file_entry, hashing, [f.result() for f in futures])
    return buffer, mismatch(file_entry, hashing, buffer)


POPULATE_FROM_BYTES = 1 << 20


def read_buffer(size: int) -> np.ndarray:
    """A uint8 buffer for `size` bytes about to be read. A large one is mapped with its
    pages populated by the kernel in the one mmap call (MAP_POPULATE), not faulted in one
    by one while the file is read into it. `np.empty` asks for transparent huge pages
    (numpy advises them for large arrays): on this VM a 2 GB verified load then took
    0.46 s at best but 2.6 s median when it followed a `torch.load` of as much, while
    populated 4 KiB pages took 0.85 / 0.99 s (min / median of 5) and `torch.load` itself
    1.1 / 1.4 s. The mapping lives as long as the array and the tensors viewing it."""
    if size < POPULATE_FROM_BYTES:
        return np.empty(size, dtype=np.uint8)
    mapped = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)
    return np.frombuffer(mapped, dtype=np.uint8)


def hash_file(path, hashing: dict, pool: ThreadPoolExecutor | None = None) -> dict:
    """The entry of a file on disk under `hashing` (files baton did not write itself)."""
    with open(path, "rb") as handle:
        data = handle.read()
    return entry(len(data), hash_chunks(data, chunk_bytes_of(hashing), pool=pool,
                                         alg=alg_of(hashing)))
