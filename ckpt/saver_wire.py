"""How a save's captured files travel to the saver process without their bytes.

The training process pickles a save's description (its files' snapshot structures,
images and JSON, the manifest recipe) with every tensor and storage reduced to its
place in a shared staging buffer: buffer id, dtype, offset, shape, stride. The C
pickler calls `reducer_override` only for objects that are not plain containers or
scalars, so this costs one Python call per tensor, not one per object (`Sender`). The saver
process rebuilds each tensor as a view of the same buffer it mapped (`Buffers`), so
`torch.save` there writes byte for byte what it would have written here.

Only the training process's own bytes are unpickled here (over a socket pair it made),
never a checkpoint's.
"""
from __future__ import annotations

import io
import mmap
import os
import pickle

import torch

from ckpt.shared_buffers import SharedBuffers


class Buffers:
    """The saver process's mappings of the staging buffers, by id."""

    table: dict[int, torch.UntypedStorage] = {}

    @classmethod
    def add(cls, ident: int, nbytes: int, fd: int) -> None:
        try:
            mapped = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)  # the mapping keeps the memory
        cls.table[ident] = torch.frombuffer(mapped, dtype=torch.uint8).untyped_storage()

    @classmethod
    def forget(cls, idents: list[int]) -> None:
        """Buffers the worker's pool dropped: unmapped once no tensor of a save uses them."""
        for ident in idents:
            cls.table.pop(ident, None)


_empties: dict[int, torch.UntypedStorage] = {}
"""Of the description being loaded: one empty storage per empty storage of the sender's
(torch.save numbers storages, empty ones too, by identity)."""


def _storage(ident: int | str) -> torch.UntypedStorage:
    if isinstance(ident, int):
        return Buffers.table[ident]
    return _empties.setdefault(int(ident), torch.UntypedStorage(0))


def _tensor(ident: int | str, dtype: torch.dtype, offset: int, size: tuple, stride: tuple,
            parameter: bool, requires_grad: bool, attributes: dict) -> torch.Tensor:
    tensor = torch.empty(0, dtype=dtype).set_(_storage(ident), offset, size, stride)
    if parameter:
        tensor = torch.nn.Parameter(tensor, requires_grad=requires_grad)
    elif requires_grad:
        tensor.requires_grad_(True)
    tensor.__dict__.update(attributes)
    return tensor


class _Pickler(pickle.Pickler):
    def __init__(self, file, shared: SharedBuffers, known: dict, seen: dict):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.shared, self.empties, self.known, self.seen = shared, {}, known, seen

    def _ident(self, storage: torch.UntypedStorage) -> int | str:
        """A buffer's id, or for an empty storage a string numbering it in this description."""
        nbytes = storage.nbytes()
        if nbytes:
            return self.shared.ident(storage.data_ptr(), nbytes)
        return str(self.empties.setdefault(storage._cdata, len(self.empties)))

    def reducer_override(self, obj):
        if isinstance(obj, torch.Tensor):
            held = self.known.get(id(obj))
            if held is not None:  # the same staged tensor as in the last save (ckpt.staging)
                self.seen[id(obj)] = held
                return held[1]
            storage = obj.untyped_storage()
            reduced = _tensor, (self._ident(storage), obj.dtype, obj.storage_offset(),
                                tuple(obj.size()), obj.stride(), type(obj) is torch.nn.Parameter,
                                obj.requires_grad, dict(obj.__dict__))
            if storage.nbytes():  # an empty one's number is this description's own
                self.seen[id(obj)] = (obj, reduced)  # `obj` held: its id stays its own
            return reduced
        if isinstance(obj, torch.UntypedStorage):
            return _storage, (self._ident(obj),)
        return NotImplemented


class Sender:
    """Pickles one save after another. Step after step a save stages the same tensor
    objects (ckpt.staging.KeptTensors), so each one's reduction is kept from the last save
    and reused: one dictionary hit per tensor instead of a dozen calls."""

    def __init__(self, shared: SharedBuffers):
        self.shared = shared
        self._known: dict[int, tuple] = {}

    def dumps(self, description) -> bytes:
        out, seen = io.BytesIO(), {}
        _Pickler(out, self.shared, self._known, seen).dump(description)
        self._known = seen  # the tensors of this save; the others are let go
        return out.getvalue()


def loads(blob: bytes):
    _empties.clear()
    try:
        return pickle.loads(blob)
    finally:
        _empties.clear()
