"""baton's DeepSpeed `CheckpointEngine`: every byte DeepSpeed writes or reads goes through it.

Saving hashes each file while it is written (one pass) and fsyncs it, so the manifest
needs no second read. Loading reads a file once, checks its sha256 against the
manifest, and only then unpickles those same bytes with `weights_only=True` and the
allow-list of `ckpt.safe_load`: a damaged, swapped or hostile file is never run. Asynchronous or tiered
saving can replace `_write_bytes` without the stages knowing.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointCommitInfo, CheckpointEngine

from ckpt.errors import CorruptCheckpoint, NotACheckpoint
from ckpt.manifest import Manifest
from ckpt.reader import CheckpointReader
from ckpt.safe_load import allow_deepspeed_globals, load_verified_bytes

ENGINE_NAME = "BatonCheckpointEngine"


class _HashingWriter:
    """File wrapper that feeds every written byte to sha256."""

    def __init__(self, handle):
        self._handle, self.digest, self.size = handle, hashlib.sha256(), 0
        self.error: OSError | None = None

    def write(self, data) -> int:
        view = memoryview(data)
        self.digest.update(view)
        self.size += view.nbytes
        try:
            return self._handle.write(view)
        except OSError as exc:
            # torch.save's zip writer turns this into a RuntimeError that no longer says
            # "No space left on device"; keep it so `_write` can raise the real cause.
            self.error = exc
            raise

    def flush(self) -> None:
        self._handle.flush()


# The allow-list lives in ckpt.safe_load; this name stays for code that imported it here.
_allow_deepspeed_globals = allow_deepspeed_globals


class BatonCheckpointEngine(CheckpointEngine):
    def __init__(self, config_params=None):
        super().__init__(config_params)
        self.name = ENGINE_NAME
        self.directory: Path | None = None
        self.written: dict[str, dict] = {}
        self._expected: Manifest | None = None
        self.fail_next_write: int | None = None
        """Fault injection (debug.fail_write_at_step): the next write raises OSError(errno)."""
        _allow_deepspeed_globals()

    # -- saving -----------------------------------------------------------------------
    def begin_save(self, directory: Path) -> None:
        self.directory, self.written = Path(directory), {}

    def create(self, info: CheckpointCommitInfo):
        pass  # the commit protocol (ckpt.commit) owns directory creation and naming

    def save(self, state_dict, path: str):
        buffer_writer = lambda handle: torch.save(state_dict, handle)  # noqa: E731
        self._write(Path(path), buffer_writer)

    def save_json(self, path: Path, payload) -> None:
        text = json.dumps(payload, indent=1, sort_keys=True).encode()
        self._write(path, lambda handle: handle.write(text))

    def save_bytes(self, path: Path, data: bytes) -> None:
        self._write(path, lambda handle: handle.write(data))

    def _write(self, path: Path, writer) -> None:
        """Write, hash and fsync one file. A refused write raises the OSError itself
        (ENOSPC, EIO, ...), whichever layer it passed through."""
        path.parent.mkdir(parents=True, exist_ok=True)
        if self.fail_next_write is not None:
            code, self.fail_next_write = self.fail_next_write, None
            raise OSError(code, os.strerror(code), str(path))
        try:
            with open(path, "wb") as raw:
                hashing = _HashingWriter(raw)
                try:
                    writer(hashing)
                except RuntimeError:
                    if hashing.error is None:
                        raise
                    raise hashing.error from None
                raw.flush()
                os.fsync(raw.fileno())
        except OSError as exc:
            exc.filename = exc.filename or str(path)  # name the file the disk refused
            raise
        rel = path.relative_to(self.directory).as_posix()
        self.written[rel] = {"size": hashing.size, "sha256": hashing.digest.hexdigest()}

    def commit(self, info: CheckpointCommitInfo):
        return True  # ckpt.commit writes the manifest once every rank has finished

    # -- loading ----------------------------------------------------------------------
    def begin_load(self, directory: Path, manifest: Manifest) -> None:
        self.directory, self._expected = Path(directory), manifest
        self._reader = CheckpointReader(directory, manifest)

    def read_verified(self, path: Path) -> bytes:
        """The file's bytes, read once and checked against the manifest."""
        if self._expected is None:
            raise NotACheckpoint(path, "load attempted without a verified manifest")
        resolved, root = Path(path).resolve(), self.directory.resolve()
        if not resolved.is_relative_to(root):
            raise CorruptCheckpoint(self.directory, [f"{path} is outside the checkpoint directory"])
        return self._reader.bytes(resolved.relative_to(root).as_posix())

    def load(self, path: str, map_location=None):
        """DeepSpeed's reads: checked bytes, then a weights_only load (ckpt.safe_load)."""
        return load_verified_bytes(self.read_verified(Path(path)), path, map_location)

    def load_json(self, path: Path):
        return json.loads(self.read_verified(path))
