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
    def __init__(self, stage_storage, views=None, memo=None):
        """`stage_storage(storage) -> staged storage`: called once per distinct storage,
        in the order the walk meets them. `views`: the staged tensors of the last save
        into the same staging buffers (ckpt.staging.KeptTensors), reused when one has the
        same buffer, dtype, offset, shape, stride and kind. `memo`: this file's
        ckpt.steady_memo.TensorMemo, with a ckpt.staging.FileStager as `stage_storage`:
        a tensor staged by the last save as it is now is not looked at again."""
        self.stage, self.staged = stage_storage, {}
        self.views, self.memo = views, memo
        self.records: dict[int, object] = {}
        """Storage key -> how the stager staged it (a StageRecord; None: not lazily)."""
        self._copied: dict[int, tuple] = {}

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
        copied = self._copied.get(id(tensor))
        if copied is not None:  # the same object again: the same object in the copy (and
            return copied[1]  # torch.save writes it once and refers back, as for the original)
        storage = tensor.untyped_storage()
        key = storage._cdata  # the storage itself, as torch.save tells storages apart
        remembered = None
        if self.memo is not None and not tensor.__dict__:
            remembered = (key, type(tensor), tensor.dtype, tensor.storage_offset(), tensor.shape,
                          tensor.stride(), tensor.requires_grad)
            staged = self.memo.again(remembered, storage, self)
            if staged is not None:
                self._copied[id(tensor)] = (tensor, staged)
                return staged
        if key not in self.staged:
            self.staged[key] = self.stage(storage)
            if self.memo is not None:
                self.records[key] = self.stage.record
        target = self.staged[key]
        kept_key = None
        if tensor.__dict__:  # attributes torch.save keeps (ZeRO-3's flat groups carry `ds_id`)
            staged = self._view(tensor, target)
            staged.__dict__.update(self.copy(tensor.__dict__))
        elif self.views is None:
            staged = self._view(tensor, target)
        else:  # step after step the same tensors land in the same buffers: last save's
            # view is this one (three torch calls fewer per tensor on the training thread)
            kept_key = (target.data_ptr(), target.nbytes(), tensor.dtype, tensor.storage_offset(),
                        tensor.shape, tensor.stride(), type(tensor), tensor.requires_grad)
            staged = self.views.get(kept_key, lambda: self._view(tensor, target))
        if remembered is not None and self.records.get(key) is not None:
            self.memo.remember(remembered, storage.nbytes(), staged, self.records[key], kept_key)
        self._copied[id(tensor)] = (tensor, staged)  # the original held: its id stays its own
        return staged

    @staticmethod
    def _view(tensor: torch.Tensor, target: torch.UntypedStorage) -> torch.Tensor:
        staged = torch.empty(0, dtype=tensor.dtype).set_(
            target, tensor.storage_offset(), tensor.size(), tensor.stride())
        if type(tensor) is torch.nn.Parameter:
            return torch.nn.Parameter(staged, requires_grad=tensor.requires_grad)
        if tensor.requires_grad:
            staged.requires_grad_(True)
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


def snapshot(obj, stage_storage, views=None, memo=None):
    """The structural copy of `obj` (raises Unsupported); `views`, `memo`: see Snapshot."""
    return Snapshot(stage_storage, views, memo).copy(obj)
