"""A structural copy of a state dict whose tensors live in staging buffers.

An asynchronous save must capture the state as it is at the save call, but pickling it
(torch.save's structure pass) costs far more than copying the containers: thousands of
persistent_id calls, on the training thread. So the training thread only rebuilds the
containers (dicts, lists, tuples) and copies each storage once into the staging pool;
the background thread pickles the copy. Tensors keep their dtype, offset, shape and
stride on the staged storage, and views of one storage stay views of one staged
storage, so the file is byte-identical to `torch.save` of the original
(tests/unit/ckpt/test_snapshot.py).

Leaves that are not containers or tensors are kept as they are when immutable (numbers,
strings, dtypes, torch.Size, enums) and deep-copied otherwise (DeepSpeed's loss scaler):
nothing the training thread changes later can reach the file.
"""
from __future__ import annotations

import copy
import enum
from collections import OrderedDict

import torch

_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device,
              torch.Size, enum.Enum, range, slice)


_PLAIN = {type(None), bool, int, float, str}


class Unsupported(TypeError):
    """A value the structural copy does not handle (a tensor subclass, a tensor inside an
    arbitrary object): the caller saves that file the plain way."""


class Snapshot:
    def __init__(self, stage_storage):
        """`stage_storage(storage) -> staged storage`: called once per distinct storage,
        in the order the walk meets them."""
        self._stage, self._staged = stage_storage, {}

    def copy(self, value):
        kind = type(value)
        if isinstance(value, torch.Tensor):
            return self._tensor(value)
        if kind in (dict, OrderedDict):
            out = kind((key, self.copy(item)) for key, item in value.items())
            if getattr(value, "__dict__", None):  # a module state dict's `_metadata`
                out.__dict__.update(self.copy(value.__dict__))
            return out
        if kind is list:
            if all(type(item) in _PLAIN for item in value):  # RNG states: 625 ints
                return list(value)
            return [self.copy(item) for item in value]
        if kind is tuple:
            return tuple(self.copy(item) for item in value)
        if isinstance(value, _IMMUTABLE):
            return value
        if kind in (set, frozenset):
            return kind(self.copy(item) for item in value)
        return self._opaque(value)

    def _tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        if type(tensor) not in (torch.Tensor, torch.nn.Parameter) or tensor.is_sparse or tensor.is_quantized:
            raise Unsupported(f"tensor of type {type(tensor).__name__} / layout {tensor.layout}")
        if tensor.is_conj() or tensor.is_neg():
            # A view over the staged bytes would lose the lazy conjugate/negative bit.
            raise Unsupported("a tensor with a conjugate or negative bit")
        storage = tensor.untyped_storage()
        key = storage._cdata  # the storage itself, as torch.save tells storages apart
        if key not in self._staged:
            self._staged[key] = self._stage(storage)
        staged = torch.empty(0, dtype=tensor.dtype).set_(
            self._staged[key], tensor.storage_offset(), tensor.size(), tensor.stride())
        if type(tensor) is torch.nn.Parameter:
            staged = torch.nn.Parameter(staged, requires_grad=tensor.requires_grad)
        elif tensor.requires_grad:
            staged.requires_grad_(True)
        if tensor.__dict__:  # attributes torch.save keeps (ZeRO-3's flat groups carry `ds_id`)
            staged.__dict__.update(self.copy(tensor.__dict__))
        return staged

    def _opaque(self, value):
        """Any other object: deep-copied, refusing tensors inside (they would be cloned
        outside the staging pool, and their sharing with the rest would be lost)."""
        copied = copy.deepcopy(value)
        found = []

        class Finder(torch.serialization.pickle.Pickler):
            def reducer_override(self, obj):
                if isinstance(obj, torch.Tensor):
                    found.append(obj)
                    return (int, (0,))
                return NotImplemented

        import io
        Finder(io.BytesIO(), protocol=2).dump(copied)
        if found:
            raise Unsupported(f"{type(value).__name__} holds tensors")
        return copied


def snapshot(obj, stage_storage):
    """The structural copy of `obj` (raises Unsupported)."""
    return Snapshot(stage_storage).copy(obj)
