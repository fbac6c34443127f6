"""Deserialize a torch.save archive from bytes already in memory, without copying storages.

The single-pass verified load reads a file once into one buffer and hashes it while
reading; parsing it with `torch.load(file_like)` would copy every storage out of that
buffer again. Here each storage is a slice of the buffer (as `torch.load(mmap=True)`
does with a mapped file), and the pickle is read by torch's own weights_only unpickler,
so the same allow-list applies (ckpt.safe_load). Anything this path does not handle
(another byte order, a device map_location) goes through `torch.load` on the buffer.

The tensors keep the buffer alive: memory stays at the file's size until the last of
them is dropped, like the storages `torch.load` would have allocated.
"""
from __future__ import annotations

import io
import sys

import torch


class BufferFile(io.RawIOBase):
    """A read-only, seekable file over a buffer (no copy of the buffer itself)."""

    def __init__(self, buffer):
        self._view, self._position = memoryview(buffer).cast("B"), 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, target) -> int:
        n = max(0, min(len(target), self._view.nbytes - self._position))
        target[:n] = self._view[self._position:self._position + n]
        self._position += n
        return n

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._position, 2: self._view.nbytes}[whence]
        self._position = base + offset
        return self._position

    def tell(self) -> int:
        return self._position


def _in_place(buffer: bytearray, map_location=None):
    from torch import _weights_only_unpickler

    archive = torch._C.PyTorchFileReader(BufferFile(buffer))
    if archive.has_record("byteorder") and bytes(archive.get_record("byteorder")) != sys.byteorder.encode():
        return None
    whole = torch.frombuffer(buffer, dtype=torch.uint8).untyped_storage() if len(buffer) else None
    storages: dict[str, torch.storage.TypedStorage] = {}

    def persistent_load(saved_id):
        kind, storage_type, key, location, numel = saved_id
        if kind != "storage":
            raise pickle_error(f"unexpected persistent id {kind!r}")
        dtype = torch.uint8 if storage_type is torch.UntypedStorage else storage_type.dtype
        if key not in storages:
            nbytes = numel * torch._utils._element_size(dtype)
            record = f"data/{key}"
            if archive.get_record_size(record) != nbytes:  # as torch.load refuses it
                raise pickle_error(f"record {record} holds {archive.get_record_size(record)} "
                                   f"bytes, its tensor claims {nbytes}")
            offset = archive.get_record_offset(record)
            untyped = whole[offset:offset + nbytes] if nbytes else torch.UntypedStorage(0)
            if callable(map_location):  # DeepSpeed passes `lambda storage, loc: storage`
                untyped = map_location(untyped, location) or untyped
            storages[key] = torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)
        return storages[key]

    unpickler = _weights_only_unpickler.Unpickler(io.BytesIO(archive.get_record("data.pkl")),
                                                  encoding="utf-8")
    unpickler.persistent_load = persistent_load
    result = unpickler.load()
    torch._utils._validate_loaded_sparse_tensors()
    return result


def pickle_error(message: str):
    import pickle
    return pickle.UnpicklingError(message)


def load_weights_only(buffer: bytearray, map_location=None):
    """`torch.load(..., weights_only=True)` of an archive held in `buffer`."""
    if callable(map_location) or map_location in (None, "cpu", torch.device("cpu")):
        try:
            loaded = _in_place(buffer, map_location)
        except (AttributeError, TypeError) as exc:  # a torch without these internals
            if "_weights_only_unpickler" not in str(exc) and "PyTorchFileReader" not in str(exc):
                raise
            loaded = None
        if loaded is not None:
            return loaded
    return torch.load(BufferFile(buffer), map_location=map_location, weights_only=True)
