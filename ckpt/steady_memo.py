"""The steady-state snapshot: a save that meets each tensor as the last save did stages it
without looking at it again.

Step after step an every-step save hands ckpt.snapshot the same state: the same storages,
viewed the same way, in the same order, with only their bytes changed. The full way of
staging a tensor (about twenty torch calls: checks, the storage's size and place, the
staging buffer, the staged view) is the largest part of the save call on the training
thread. So each file's snapshot remembers, per tensor, how it was staged (`TensorMemo`),
keyed by what fixes the staged copy's bytes and structure: the storage itself (its
`_cdata`, held alive by the kept live view, so no other storage can take it), its size,
and the tensor's type, dtype, offset, shape, stride and requires_grad. The next save
reuses the staged tensor when all of them match and the storage comes at the same place
in the file, into the same buffer (`FileStager.again`); the bytes are still copied, by
ckpt.deferred_copy, from the live storage. Anything else (a replaced or resized storage,
a new view, a tensor with Python attributes, a change earlier in the file) takes the full
way, and so does every tensor of an eager or device save.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ckpt.staging import StageRecord


@dataclass
class Remembered:
    staged: torch.Tensor
    """The staged tensor the last save returned (a view over the staging buffer)."""
    nbytes: int
    record: StageRecord
    kept_key: tuple | None
    """Its key in the slot's ckpt.staging.KeptTensors, claimed again on reuse."""


class TensorMemo:
    """One file's staged tensors, from one save to the next into the same slot."""

    def __init__(self):
        self._kept: dict[tuple, Remembered] = {}
        self._used: dict[tuple, Remembered] = {}

    def again(self, key: tuple, storage: torch.UntypedStorage, snapshot) -> torch.Tensor | None:
        """The staged tensor for `key` if the last save staged it and nothing about it
        changed; None: stage it the full way. `snapshot`: the ckpt.snapshot.Snapshot
        being taken (its stager, staged storages and kept views)."""
        found = self._kept.get(key)
        if found is None or key in self._used or storage.nbytes() != found.nbytes:
            return None
        views = snapshot.views
        if views is not None and found.kept_key is not None and not views.free(found.kept_key):
            return None  # that staged view is another tensor's in this save
        storage_key = key[0]
        target = snapshot.staged.get(storage_key)
        if target is None:  # this storage's first tensor in the file: stage it as before
            if not snapshot.stage.again(found.record):
                return None
            snapshot.staged[storage_key] = found.record.staged
            snapshot.records[storage_key] = found.record
        elif target is not found.record.staged:
            return None
        if views is not None and found.kept_key is not None:
            views.claim(found.kept_key, found.staged)
        self._used[key] = found
        return found.staged

    def remember(self, key: tuple, nbytes: int, staged: torch.Tensor, record: StageRecord,
                 kept_key: tuple | None) -> None:
        if key not in self._used:  # a twin view of the same storage stays the full way's
            self._used[key] = Remembered(staged, nbytes, record, kept_key)

    def forget_unused(self) -> None:
        self._kept, self._used = self._used, {}

    def __len__(self) -> int:
        return len(self._kept)
