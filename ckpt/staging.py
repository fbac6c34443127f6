"""The staging buffer pool: where an asynchronous save copies the state, reused every save.

The training step is blocked only while storages are copied here; the background
writer reads the copies while training changes the originals. With `lazy` (the default,
`ckpt.snapshot=lazy`), host storages are not copied by the save call: the stager records
(buffer, live storage) pairs, both as kept uint8 views, in `Slot.deferred`, and
ckpt.deferred_copy copies them while the next forward and backward run, before the next
optimizer step. Buffers are allocated
once per (slot, file, storage index) and reused while the sizes match (they do, step
after step), so a save allocates nothing after the first: one staging copy of the state
per in-flight save, which the bench reports as peak extra host memory.

Addresses are 4096-aligned so the native writer can use O_DIRECT. On a GPU the buffers
are pinned host memory and the copies are device-to-host on a side stream; the writer
waits on the slot's event before reading (`Slot.device_ready`). This machine has no GPU: that
branch is code and docs (docs/async_checkpoints.md), the CPU path is what runs here.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from ckpt.file_image import as_bytes

PAGE = 4096


def _aligned_empty(nbytes: int, pinned: bool) -> torch.Tensor:
    raw = torch.empty(nbytes + PAGE, dtype=torch.uint8, pin_memory=pinned)
    start = (-raw.data_ptr()) % PAGE
    return raw[start:start + nbytes]


@dataclass
class Slot:
    """The buffers of one in-flight save."""

    index: int
    buffers: dict[str, list[torch.UntypedStorage]] = field(default_factory=dict)
    event: object = None
    """CUDA event recorded after the device-to-host copies (None on CPU)."""
    deferred: list = field(default_factory=list)
    """Lazy: (buffer, storage) pairs the save recorded and has not copied yet."""
    copies: object = None
    """Lazy: the ckpt.deferred_copy.CopyBatch filling this slot (None: copied at the save)."""
    views: dict[int, torch.Tensor] = field(default_factory=dict)
    """data_ptr -> a uint8 tensor over exactly that staged buffer, made once with it: the
    copier and the writer reuse it every save instead of building a view of each storage
    (two torch calls each, every one a GIL hand-off between the saver and the step)."""
    tensors: "KeptTensors" = field(default_factory=lambda: KeptTensors())
    """ckpt.snapshot's staged tensors over these buffers, reused by the next save that
    stages the same tensor here."""
    memos: dict = field(default_factory=dict)
    """File -> its ckpt.steady_memo.TensorMemo: how each tensor was staged (lazy saves)."""

    def byte_view(self, storage: torch.UntypedStorage) -> torch.Tensor:
        """The staged buffer behind `storage` as uint8 (any storage: a fresh view)."""
        view = self.views.get(storage.data_ptr())
        return view if view is not None and view.numel() == storage.nbytes() else as_bytes(storage)

    def nbytes(self) -> int:
        return sum(b.nbytes() for per_file in self.buffers.values() for b in per_file)

    def device_ready(self) -> None:
        """Block until the device-to-host copies landed (lazy host copies are followed
        piece by piece by the writer instead: ckpt.writers.gate)."""
        if self.event is not None:
            self.event.synchronize()


class KeptTensors:
    """The staged tensors (views over a slot's buffers) one save's snapshot made, for the
    next save into the same slot: step after step the same tensors land in the same
    buffers, and reusing the view saves three torch calls per tensor on the training
    thread. Keyed by (buffer address, buffer size, dtype, offset, shape, stride, type,
    requires_grad); a kept view holds its buffer alive, so an address is never another
    buffer's while its key is here. Views the last save did not use are dropped at its
    capture (`forget_unused`), and with them any buffer the pool let go."""

    def __init__(self):
        self._kept: dict[tuple, torch.Tensor] = {}
        self._used: dict[tuple, torch.Tensor] = {}

    def get(self, shape: tuple, make) -> torch.Tensor:
        """The kept view for `shape`, or `make()`. A second tensor of the same shape in one
        save gets a view of its own: two tensor objects must stay two in the pickle (one
        object would be written once and referenced, and the bytes would differ from
        torch.save's)."""
        if shape in self._used:
            return make()
        view = self._kept.get(shape)
        if view is None:
            view = make()
        self._used[shape] = view
        return view

    def free(self, shape: tuple) -> bool:
        """No tensor of this save holds the view for `shape` yet."""
        return shape not in self._used

    def claim(self, shape: tuple, view: torch.Tensor) -> None:
        """`view` is this save's for `shape` (ckpt.steady_memo reuses it without `get`)."""
        self._used[shape] = view

    def forget_unused(self) -> None:
        self._kept, self._used = self._used, {}

    def __len__(self) -> int:
        return len(self._kept)


class StagingPool:
    def __init__(self, slots: int, lazy: bool = False, shared=None):
        """`shared`: a ckpt.shared_buffers.SharedBuffers to allocate from, so the saver
        process can read the buffers (`ckpt.saver=process`)."""
        self.lazy, self.shared = lazy, shared
        self._free = [Slot(i) for i in range(max(slots, 1))]
        self._all = list(self._free)
        self._available = threading.Condition()
        self._gpu = torch.cuda.is_available()
        self._stream = torch.cuda.Stream() if self._gpu else None
        self._live_views: dict[tuple[int, int], torch.Tensor] = {}
        self._live_used: dict[tuple[int, int], torch.Tensor] = {}

    def acquire(self) -> Slot:
        """A free slot; blocks while every slot holds a save still being written."""
        with self._available:
            self._available.wait_for(lambda: bool(self._free))
            slot = self._free.pop(0)
        slot.copies = slot.event = None  # the previous save's copies are not this one's
        return slot

    def release(self, slot: Slot) -> None:
        with self._available:
            self._free.append(slot)
            self._available.notify()

    def allocated_bytes(self) -> int:
        return sum(slot.nbytes() for slot in self._all)

    def stage(self, slot: Slot, key: str, storages: list[torch.UntypedStorage]) -> list[torch.Tensor]:
        """Copy `storages` into the slot's buffers for file `key`; return the copies as
        uint8 tensors (what fills a FileImage's holes)."""
        stager = self.stager(slot, key)
        return [slot.byte_view(stager(storage)) for storage in storages]

    def stager(self, slot: Slot, key: str) -> "FileStager":
        """A function that copies one storage into the slot's next buffer for file `key`
        and returns the copy as a storage of exactly the same size (aligned)."""
        return FileStager(self, slot, key)

    def _live_view(self, storage: torch.UntypedStorage) -> tuple[tuple[int, int], torch.Tensor]:
        """A uint8 view of a live storage (and its key), made on its first save and reused
        by the next.

        The copier would otherwise build one per storage and save: two torch calls each,
        and every torch call on a background thread hands the GIL back and forth with the
        training step (`python -m bench.gil_probe` measures what that costs). The kept view
        holds its storage alive, so no other storage can appear at its address: a hit on
        (address, size) is the same bytes. `forget_unused` drops the views the save did
        not use (a storage the engine replaced, e.g. by a load, is then no longer held)."""
        key = (storage.data_ptr(), storage.nbytes())
        view = self._live_views.get(key)
        if view is None:
            view = as_bytes(storage)
        self._live_used[key] = view
        return key, view

    def forget_unused(self, slot: Slot, keys: set[str]) -> None:
        """After a save's capture: drop buffers of files this save no longer has (a layout
        change), and the live views it did not use."""
        self._live_views, self._live_used = self._live_used, {}
        for key in list(slot.buffers):
            if key not in keys:
                del slot.buffers[key]
        kept = {b.data_ptr() for per_file in slot.buffers.values() for b in per_file}
        if self.shared is not None:  # the saver process maps them too: it lets go as well
            for ptr in slot.views.keys() - kept:
                self.shared.drop(ptr)
        slot.views = {ptr: view for ptr, view in slot.views.items() if ptr in kept}
        slot.tensors.forget_unused()
        slot.memos = {key: memo for key, memo in slot.memos.items() if key in keys}
        for memo in slot.memos.values():
            memo.forget_unused()


@dataclass
class StageRecord:
    """How one live storage was staged lazily, kept for the next save of the same file
    (ckpt.snapshot's steady-state memo): its place in the file's buffers, the buffer,
    and the two kept views the copier copies between."""

    index: int
    staged: torch.UntypedStorage
    buffer_view: torch.Tensor
    live_view: torch.Tensor
    live_key: tuple[int, int]


class FileStager:
    """Stages the storages of one file into a slot, in the order the walk meets them:
    the i-th storage reuses the i-th buffer of the last save of this file when the sizes
    match (they do, step after step), else gets a new one."""

    def __init__(self, pool: StagingPool, slot: Slot, key: str):
        self.pool, self.slot = pool, slot
        self.kept = slot.buffers.get(key, [])
        slot.buffers[key] = self.used = []
        self.record: StageRecord | None = None
        """Of the last call, when it staged lazily (a CPU storage, `lazy`); else None."""

    def __call__(self, storage: torch.UntypedStorage) -> torch.UntypedStorage:
        pool, slot = self.pool, self.slot
        nbytes, index, kept = storage.nbytes(), len(self.used), self.kept
        if index < len(kept) and kept[index].nbytes() == nbytes:
            staged = kept[index]
        else:
            cuda = pool._gpu and storage.device.type == "cuda"
            buffer = (pool.shared.allocate(nbytes) if pool.shared is not None and nbytes
                      else _aligned_empty(nbytes, pinned=cuda))
            # A storage of exactly these bytes (its own start, aligned), kept for reuse.
            staged = buffer.untyped_storage()[buffer.storage_offset():buffer.storage_offset() + nbytes]
            slot.views[staged.data_ptr()] = buffer
        self.record = None
        if storage.device.type == "cpu" and pool.lazy:
            # copied by ckpt.deferred_copy, from a kept view into the buffer's kept view
            live_key, live_view = pool._live_view(storage)
            self.record = StageRecord(index, staged, slot.views[staged.data_ptr()], live_view,
                                      live_key)
            slot.deferred.append((self.record.buffer_view, live_view))
        elif storage.device.type == "cpu":
            staged.copy_(storage)
        else:
            compute = torch.cuda.current_stream(storage.device)
            with torch.cuda.stream(pool._stream):  # overlaps with the next step's kernels
                pool._stream.wait_stream(compute)  # the state as of the save call
                staged.copy_(storage, non_blocking=True)
            # The next step's in-place updates wait for the copy (the host does not).
            slot.event = torch.cuda.Event()
            slot.event.record(pool._stream)
            compute.wait_event(slot.event)
        self.used.append(staged)
        return staged

    def again(self, record: StageRecord) -> bool:
        """Stage a storage as the last save of this file did (`record`), without looking at
        it: allowed only at the same place in the file, into the same buffer. False: the
        file changed before this storage, and the caller stages it the full way."""
        index = len(self.used)
        if index != record.index or index >= len(self.kept) or self.kept[index] is not record.staged:
            return False
        self.pool._live_used[record.live_key] = record.live_view
        self.slot.deferred.append((record.buffer_view, record.live_view))
        self.used.append(record.staged)
        return True
