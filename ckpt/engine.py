"""baton's DeepSpeed `CheckpointEngine`: every byte DeepSpeed writes or reads goes through it.

Saving only captures: each file DeepSpeed hands over becomes a `FileImage` (structure
pickled, storages found) whose storage bytes are either copied into the staging pool
(`ckpt.mode=async`: training continues once the copy is done) or read in place (`sync`).
`ckpt.save_job` then writes, hashes and fsyncs them and commits. Loading reads a file
once, hashing it while it is read, checks it against the manifest, and only then
unpickles those same bytes with `weights_only=True` and the allow-list of
`ckpt.safe_load`: a damaged, swapped or hostile file is never run.
"""
from __future__ import annotations

import json
from pathlib import Path

from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointCommitInfo, CheckpointEngine

from ckpt import selective
from ckpt.errors import CorruptCheckpoint, NotACheckpoint
from ckpt.file_image import ALIGNMENT, FileImage, as_bytes, crc32_off, image_of
from ckpt.layout import TMP_SUFFIX
from ckpt.manifest import Manifest
from ckpt.reader import CheckpointReader
from ckpt.safe_load import allow_deepspeed_globals, load_verified_bytes
from ckpt.save_job import CapturedFile, NotPlainJson, encode_json, json_copy
from ckpt.snapshot import Unsupported, snapshot
from ckpt.staging import Slot, StagingPool
from ckpt.steady_memo import TensorMemo

ENGINE_NAME = "BatonCheckpointEngine"


class BatonCheckpointEngine(CheckpointEngine):
    def __init__(self, pool: StagingPool | None = None, alignment: int = ALIGNMENT):
        super().__init__(None)
        self.alignment = alignment
        """Of storages inside each file: 4096 lets O_DIRECT write them (ckpt.direct)."""
        self.name = ENGINE_NAME
        self.directory: Path | None = None
        self.captured: list[CapturedFile] = []
        self.pool, self.slot = pool, None
        self._expected: Manifest | None = None
        self.selective: selective.SelectivePolicy | None = None
        """Set (ckpt.selective.threshold): the model-states file is saved by layer."""
        self.references: dict[str, str] = {}
        """Of the save being captured: layer file -> the earlier checkpoint holding it."""
        self.defer_json = False
        """Set with the saver process (`ckpt.saver=process`): JSON payloads are copied
        (containers only) and encoded there, off the training thread (`save_json`)."""
        crc32_off()
        allow_deepspeed_globals()

    # -- saving: capture only; ckpt.save_job writes ---------------------------------------
    def begin_save(self, directory: Path, slot: Slot | None = None) -> None:
        """`slot`: copy storages into these staging buffers (async); None: the job reads
        the live storages while training waits (sync)."""
        self.directory, self.captured, self.slot = Path(directory), [], slot
        self.references: dict[str, str] = {}

    def create(self, info: CheckpointCommitInfo):
        pass  # the commit protocol (ckpt.commit) owns directory creation and naming

    def save(self, state_dict, path: str):
        rel = Path(path).relative_to(self.directory).as_posix()
        if self.selective is not None and rel == selective.MODEL_STATES:
            state_dict = self._save_layers(state_dict)
        if self.slot is not None:
            try:  # the cheap capture: containers rebuilt, storages copied, pickled later
                memo = (self.slot.memos.setdefault(rel, TensorMemo())
                        if self.pool.lazy else None)
                state = snapshot(state_dict, self.pool.stager(self.slot, rel), self.slot.tensors,
                                 memo)
                self.captured.append(CapturedFile(rel, state=state, alignment=self.alignment))
                return
            except Unsupported:
                pass  # pickle the structure now; only the storages are staged
        image = image_of(state_dict, self.alignment)
        if self.slot is None:  # sync: read in place (a GPU storage is brought to host first)
            buffers = [as_bytes(s if s.device.type == "cpu" else s.cpu()) for s in image.storages]
        else:
            buffers = self.pool.stage(self.slot, rel, image.storages)
        self.captured.append(CapturedFile(rel, image, buffers))

    def _save_layers(self, state_dict) -> dict:
        """Selective persistence: capture the layer groups that changed enough, note where
        the others already are (`self.references`); return the skeleton to save."""
        skeleton, groups = self.selective.split(state_dict)
        checkpoint = self.directory.name.removesuffix(TMP_SUFFIX)
        self.references = self.selective.decide(groups, checkpoint, str(self.directory.parent))
        for group, parts in groups.items():
            rel = selective.layer_rel(group)
            if rel not in self.references:
                self.save(parts, str(self.directory / rel))
        return skeleton

    def save_json(self, path: Path, payload) -> None:
        """Encoded now (the C encoder: a quarter of a millisecond for a save's payloads),
        so the bytes are this moment's. With the saver process, plain JSON data is copied
        instead (`json_copy`) and encoded there. On the saver thread encoding would hold
        the GIL the step needs, so with it the payloads are encoded here."""
        rel = Path(path).relative_to(self.directory).as_posix()
        if self.defer_json and self.slot is not None:
            try:
                self.captured.append(CapturedFile(rel, json=json_copy(payload)))
                return
            except NotPlainJson:
                pass  # encoded now: whatever json says about it is raised here
        self.captured.append(CapturedFile(rel, FileImage.of_bytes(encode_json(payload))))

    def save_bytes(self, path: Path, data: bytes) -> None:
        rel = Path(path).relative_to(self.directory).as_posix()
        self.captured.append(CapturedFile(rel, FileImage.of_bytes(data)))

    def commit(self, info: CheckpointCommitInfo):
        return True  # ckpt.commit writes the manifest once every rank has finished

    # -- loading ----------------------------------------------------------------------
    def begin_load(self, directory: Path, manifest: Manifest) -> None:
        self.directory, self._expected = Path(directory), manifest
        self._reader = CheckpointReader(directory, manifest)

    def read_verified(self, path: Path):
        """The file's bytes, read once and checked against the manifest."""
        if self._expected is None:
            raise NotACheckpoint(path, "load attempted without a verified manifest")
        resolved, root = Path(path).resolve(), self.directory.resolve()
        if not resolved.is_relative_to(root):
            raise CorruptCheckpoint(self.directory, [f"{path} is outside the checkpoint directory"])
        return self._reader.bytes(resolved.relative_to(root).as_posix())

    def load(self, path: str, map_location=None):
        """DeepSpeed's reads: checked bytes, then a weights_only load (ckpt.safe_load); a
        selectively saved model-states file is assembled from its layers' files."""
        state = load_verified_bytes(self.read_verified(Path(path)), path, map_location)
        if selective.is_layered(state):
            state = selective.assemble(state, lambda rel: self._reader.torch(rel, map_location))
        return state

    def load_json(self, path: Path):
        return json.loads(self.read_verified(path).tobytes())
