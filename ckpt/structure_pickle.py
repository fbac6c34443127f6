"""torch.save's structure pass without its per-object Python: the same bytes, less GIL.

torch.save pickles with a Python `persistent_id` that the C pickler calls for every
object (about 2,000 for the tiny model's DeepSpeed state: every int and string of the
optimizer's param groups), and a Python `__reduce_ex__` for every tensor. On the
background saver that work holds the GIL the training thread needs
(docs/async_checkpoints.md, "What a save costs the step"). For the tiny model's state
this pass takes about 3.1 ms instead of 4.2 ms.

This module writes the same archive through torch's own zip writer, but pickles with a
`reducer_override` that the C pickler calls only for non-builtin objects (the tensors)
and a `persistent_id` that is one type check. It builds exactly the reduction torch's
fast path builds for a plain dense CPU tensor or parameter (`_rebuild_tensor_v2` with a
typed-storage persistent id), so `data.pkl` is byte-identical to torch.save's
(tests/unit/ckpt/test_structure_pickle.py compares them). Anything else (tensor
subclasses, tensors with Python attributes or hooks, sparse, quantized or device
tensors, the newer dtypes torch saves as untyped storages) raises `Fallback`, and the
caller uses torch.save itself.
"""
from __future__ import annotations

import copyreg
import io
import pickle
import sys
from collections import OrderedDict

import torch
from torch._utils import _get_obj_state, _rebuild_parameter, _rebuild_tensor_v2, get_tensor_metadata

PROTOCOL = 2  # torch.serialization.DEFAULT_PROTOCOL

_STORAGE_TYPES = {dtype: getattr(torch, name)
                  for dtype, name in torch.storage._dtype_to_storage_type_map().items()}
"""The dtypes torch pickles as typed storages (FloatStorage, ...); the newer ones (uint16,
float8, ...) take another path, and quantized tensors are refused before this is asked."""


class Fallback(Exception):
    """Something torch.save handles on a path this module does not reproduce."""


class _StorageRef:
    """Stands in for torch's TypedStorage in a tensor's reduction; `persistent_id` turns
    it into the same id tuple torch writes."""

    __slots__ = ("storage", "dtype")

    def __init__(self, storage: torch.UntypedStorage, dtype: torch.dtype):
        self.storage, self.dtype = storage, dtype


class _StructurePickler(pickle.Pickler):
    def __init__(self, file):
        super().__init__(file, protocol=PROTOCOL)
        self.keys: dict[int, str] = {}
        """storage._cdata -> its key in the archive (data/<key>), in first-seen order."""
        self.storages: list[torch.UntypedStorage] = []
        self.locations: dict[str, str] = {}
        self._dtypes: dict[int, torch.dtype] = {}

    def reducer_override(self, obj):
        kind = type(obj)
        if kind is torch.Tensor:
            return self._tensor(obj)
        if kind is torch.nn.Parameter:
            if _has_state(obj):
                raise Fallback("a parameter with Python attributes")
            return _rebuild_parameter, (obj.data, obj.requires_grad, OrderedDict())
        if isinstance(obj, (torch.Tensor, torch.TypedStorage, torch.UntypedStorage)):
            raise Fallback(f"a {kind.__name__}")
        return NotImplemented

    def _tensor(self, tensor: torch.Tensor):
        if (tensor.device.type != "cpu" or tensor.layout != torch.strided or tensor.is_quantized
                or tensor.is_nested or tensor.dtype not in _STORAGE_TYPES):
            raise Fallback(f"a {tensor.device.type} tensor, {tensor.layout}, {tensor.dtype}")
        if _has_state(tensor) or tensor._backward_hooks or get_tensor_metadata(tensor):
            raise Fallback("a tensor with Python attributes, hooks or metadata")
        ref = _StorageRef(tensor.untyped_storage(), tensor.dtype)
        return _rebuild_tensor_v2, (ref, tensor.storage_offset(), tuple(tensor.size()),
                                    tensor.stride(), tensor.requires_grad, OrderedDict())

    def persistent_id(self, obj):
        if type(obj) is not _StorageRef:
            return None
        storage, dtype = obj.storage, obj.dtype
        ptr = storage.data_ptr()
        if ptr and self._dtypes.setdefault(ptr, dtype) != dtype:
            raise Fallback("one storage viewed as two dtypes")  # torch.save refuses it
        key = self.keys.get(storage._cdata)
        if key is None:
            key = self.keys[storage._cdata] = str(len(self.keys))
            self.storages.append(storage)
            self.locations[key] = torch.serialization.location_tag(storage)  # torch's own tag
        return ("storage", _STORAGE_TYPES[dtype], key, self.locations[key],
                storage.nbytes() // dtype.itemsize)


def _has_state(tensor: torch.Tensor) -> bool:
    """What torch's own reduction tests: any state sends it down another path."""
    return bool(_get_obj_state(tensor))


def save_structure(obj, file) -> list[torch.UntypedStorage]:
    """Write `torch.save(obj)` to `file` under `skip_data` (zip headers, data.pkl, and a
    seek over each storage's bytes); return the storages in archive order. Raises
    Fallback before writing anything if torch.save would take another path."""
    if not torch.serialization._serialization_tls.skip_data:
        raise ValueError("save_structure writes no storage bytes: call it under "
                         "torch.serialization.skip_data()")
    if any(kind in copyreg.dispatch_table for kind in (torch.Tensor, torch.nn.Parameter)):
        raise Fallback("a copyreg reduction registered for tensors")  # torch.save would use it
    buffer = io.BytesIO()
    pickler = _StructurePickler(buffer)
    pickler.dump(obj)
    data = buffer.getvalue()
    storages = pickler.storages
    alignment = str(torch.serialization._get_storage_alignment())
    with torch.serialization._open_zipfile_writer(file) as archive:
        archive.write_record("data.pkl", data, len(data))
        archive.write_record(".format_version", "1", 1)
        archive.write_record(".storage_alignment", alignment, len(alignment))
        archive.write_record("byteorder", sys.byteorder, len(sys.byteorder))
        for key, storage in zip(pickler.keys.values(), storages):
            archive.write_record_metadata(f"data/{key}", storage.nbytes())
    return storages
