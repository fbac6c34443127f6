"""baton's DeepSpeed `CheckpointEngine`: every byte DeepSpeed writes or reads goes through it.

Saving hashes each file while it is written (one pass) and fsyncs it, so the manifest
needs no second read. Loading reads a file once, checks its sha256 against the
manifest, and only then unpickles those same bytes with `weights_only=True`: a
damaged or swapped file is never handed to the unpickler. Asynchronous or tiered
saving can replace `_write_bytes` without the stages knowing.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import torch
from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointCommitInfo, CheckpointEngine

from ckpt.errors import CorruptCheckpoint, NotACheckpoint
from ckpt.manifest import Manifest

ENGINE_NAME = "BatonCheckpointEngine"


class _HashingWriter:
    """File wrapper that feeds every written byte to sha256."""

    def __init__(self, handle):
        self._handle, self.digest, self.size = handle, hashlib.sha256(), 0

    def write(self, data) -> int:
        view = memoryview(data)
        self.digest.update(view)
        self.size += view.nbytes
        return self._handle.write(view)

    def flush(self) -> None:
        self._handle.flush()


def _allow_deepspeed_globals() -> None:
    """Classes DeepSpeed pickles into its checkpoint files, allowed for weights_only loads."""
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.utils.tensor_fragment import fragment_address

    safe = [DeepSpeedConfig, LossScaler, DynamicLossScaler, fragment_address]
    try:
        from deepspeed.runtime.zero.config import ZeroStageEnum
        safe.append(ZeroStageEnum)
    except ImportError:
        pass
    torch.serialization.add_safe_globals(safe)


class BatonCheckpointEngine(CheckpointEngine):
    def __init__(self, config_params=None):
        super().__init__(config_params)
        self.name = ENGINE_NAME
        self.directory: Path | None = None
        self.written: dict[str, dict] = {}
        self._expected: Manifest | None = None
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
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as raw:
            hashing = _HashingWriter(raw)
            writer(hashing)
            raw.flush()
            os.fsync(raw.fileno())
        rel = path.relative_to(self.directory).as_posix()
        self.written[rel] = {"size": hashing.size, "sha256": hashing.digest.hexdigest()}

    def commit(self, info: CheckpointCommitInfo):
        return True  # ckpt.commit writes the manifest once every rank has finished

    # -- loading ----------------------------------------------------------------------
    def begin_load(self, directory: Path, manifest: Manifest) -> None:
        self.directory, self._expected = Path(directory), manifest

    def read_verified(self, path: Path) -> bytes:
        """The file's bytes, after checking them against the manifest."""
        if self._expected is None:
            raise NotACheckpoint(path, "load attempted without a verified manifest")
        rel = Path(path).resolve().relative_to(self.directory.resolve()).as_posix()
        entry = self._expected.files.get(rel)
        if entry is None:
            raise CorruptCheckpoint(self.directory, [f"{rel} is not listed in the manifest"])
        data = Path(path).read_bytes()
        actual = hashlib.sha256(data).hexdigest()
        if len(data) != entry["size"] or actual != entry["sha256"]:
            raise CorruptCheckpoint(self.directory, [
                f"checksum mismatch in {rel}: sha256 {actual[:16]}… ({len(data)} bytes) read, "
                f"{entry['sha256'][:16]}… ({entry['size']} bytes) in the manifest"])
        return data

    def load(self, path: str, map_location=None):
        data = self.read_verified(Path(path))
        return torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)

    def load_json(self, path: Path):
        return json.loads(self.read_verified(path))
