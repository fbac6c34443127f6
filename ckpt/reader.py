"""The checked reader: each file of a checkpoint is read once, checked against the manifest
(size and sha256), and only those same bytes are parsed.

Checking a file and then opening it again to parse it leaves a window in which the file
can be swapped; reading once closes it. DeepSpeed's helpers open files by path
themselves, so they get a private copy written from checked bytes (`private_copy`).
"""
from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ckpt import content_hash
from ckpt import manifest as manifest_io
from ckpt.layout import referenced_path
from ckpt import safe_load
from ckpt.errors import CorruptCheckpoint
from ckpt.manifest import Manifest

_POOL: ThreadPoolExecutor | None = None


def _hash_pool() -> ThreadPoolExecutor:
    """Threads that hash chunks while the reading thread reads the next ones."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(content_hash.DEFAULT_THREADS, thread_name_prefix="baton-read")
    return _POOL


class CheckpointReader:
    def __init__(self, directory: str | Path, manifest: Manifest | None = None):
        """`manifest`: one the caller already read (and usually verified); else it is read
        here, which confines its paths and checks its signature."""
        self.directory = Path(directory)
        self.manifest = manifest if manifest is not None else manifest_io.read(self.directory)

    def entry(self, rel: str) -> dict:
        entry = self.manifest.files.get(rel) or self.manifest.references.get(rel)
        if entry is None:
            raise CorruptCheckpoint(self.directory, [f"{rel} is not listed in the manifest"])
        return entry

    def path_of(self, rel: str) -> Path:
        """Where `rel` lives: here, or in the earlier checkpoint the manifest references."""
        if rel in self.manifest.files:
            return self.directory / rel
        return referenced_path(self.directory, rel, self.entry(rel))

    def _mismatch(self, rel: str, problem: str) -> CorruptCheckpoint:
        return CorruptCheckpoint(self.directory, [
            f"checksum mismatch in {rel}: {problem} (corrupted, or changed after it was written)"])

    def bytes(self, rel: str):
        """The file's bytes (a uint8 numpy array, bytes-like), read once and hashed while
        read (chunks in parallel); never more than the manifest's size plus one byte."""
        data, problem = content_hash.read_checked(self.path_of(rel), self.entry(rel),
                                                  self.manifest.hashing, _hash_pool())
        if problem:
            raise self._mismatch(rel, problem)
        return data

    def json(self, rel: str):
        return json.loads(self.bytes(rel).tobytes())

    def torch(self, rel: str, map_location="cpu"):
        """A weights_only load of the checked bytes (ckpt.safe_load); a model-states file
        saved selectively comes back whole (ckpt.selective.assemble)."""
        from ckpt import selective

        state = safe_load.load_verified_bytes(self.bytes(rel), self.path_of(rel), map_location)
        if selective.is_layered(state):
            state = selective.assemble(state, lambda part: self.torch(part, map_location))
        return state

    def load(self, rel: str):
        """Parse by file type: JSON, safetensors, torch pickle, else the raw bytes."""
        if rel.endswith(".json"):
            return self.json(rel)
        if rel.endswith(".safetensors"):
            from safetensors.torch import load
            return load(bytes(self.bytes(rel)))  # safetensors takes bytes only
        if safe_load.is_pickle_name(rel):
            return self.torch(rel)
        return bytes(self.bytes(rel))

    def copy(self, rel: str, dest: Path) -> None:
        """Write the checked bytes to `dest`. A pickle must also pass the allow-list scan
        (it is about to reach DeepSpeed)."""
        data = self.bytes(rel)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
        if safe_load.is_pickle_name(rel):
            safe_load.check_pickle(dest, self.directory / rel)


@contextlib.contextmanager
def private_copy(reader: CheckpointReader, rels: list[str], under: Path | None = None):
    """A temporary copy of `rels`, each checked on the way, in a directory named like the
    checkpoint (DeepSpeed helpers take it as their tag); removed afterwards. `under`: where
    to put it (default: the system temp directory)."""
    if under is not None:
        under.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=".baton-checked-", dir=under))
    try:
        copy = root / reader.directory.name
        for rel in rels:
            reader.copy(rel, copy / rel)
        yield copy
    finally:
        shutil.rmtree(root, ignore_errors=True)


def pickle_files(manifest: Manifest) -> list[str]:
    """The manifest's torch pickles (what DeepSpeed's helpers open)."""
    return sorted(rel for rel in manifest.files if safe_load.is_pickle_name(rel))
