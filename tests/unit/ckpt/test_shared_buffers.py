"""Staging buffers in shared memory: another mapping of the same descriptor sees what the
worker wrote, ids are never reused, each descriptor is handed over once, and a buffer the
pool drops is dropped by the saver process too (or never sent)."""
from __future__ import annotations

import mmap
import os

import pytest
import torch

from ckpt.saver_wire import Buffers
from ckpt.shared_buffers import SharedBuffers
from ckpt.staging import StagingPool


def test_a_buffer_is_shared_memory_named_by_an_id_and_its_descriptor_is_handed_over_once():
    shared = SharedBuffers()
    first, second = shared.allocate(5000), shared.allocate(64)
    first[:4] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8)
    sent = shared.take_unsent()
    assert [(ident, nbytes) for ident, nbytes, _ in sent] == [(0, 5000), (1, 64)]
    assert shared.take_unsent() == []
    third = shared.allocate(10)  # ids are never reused, also after the first were sent
    [(ident, _, fd_third)] = shared.take_unsent()
    assert ident == 2
    for _, nbytes, fd in sent:  # what the saver process does with each
        other = mmap.mmap(fd, nbytes)
        os.close(fd)
        if nbytes == 5000:
            assert other[:4] == bytes([1, 2, 3, 4])
    os.close(fd_third)
    assert first.data_ptr() % mmap.PAGESIZE == 0  # O_DIRECT-ready
    assert shared.ident(first.data_ptr(), 5000) == 0 and shared.ident(third.data_ptr(), 10) == 2
    with pytest.raises(ValueError, match="not a shared staging buffer"):
        shared.ident(second.data_ptr(), 65)  # larger than that buffer
    with pytest.raises(ValueError, match="not a shared staging buffer"):
        shared.ident(torch.empty(8).data_ptr(), 8)
    shared.close()


def test_a_buffer_the_pool_drops_is_named_to_the_saver_once_or_never_sent():
    shared = SharedBuffers()
    sent = shared.allocate(4096)
    [(sent_id, _, fd)] = shared.take_unsent()
    os.close(fd)
    unsent = shared.allocate(4096)
    shared.allocate(64)  # not sent yet either
    shared.drop(sent.data_ptr())
    shared.drop(unsent.data_ptr())  # never sent: its descriptor is closed here instead
    assert shared.take_dropped() == [sent_id]
    assert shared.take_dropped() == []
    assert [ident for ident, _, _ in shared.take_unsent()] == [2]  # not the dropped one
    with pytest.raises(ValueError, match="not a shared staging buffer"):
        shared.ident(sent.data_ptr(), 4096)
    shared.drop(sent.data_ptr())  # twice: nothing more to tell
    assert shared.take_dropped() == []
    shared.close()


def test_the_pool_drops_the_shared_buffers_of_a_file_a_save_no_longer_has():
    shared = SharedBuffers()
    pool = StagingPool(1, shared=shared)
    slot = pool.acquire()
    for rel in ("model_states.pt", "layer_00.pt"):
        pool.stage(slot, rel, [torch.arange(1024, dtype=torch.float32).untyped_storage()])
    pool.forget_unused(slot, {"model_states.pt", "layer_00.pt"})
    for _, _, fd in shared.take_unsent():
        os.close(fd)
    assert shared.take_dropped() == []  # every file kept its buffers
    pool.release(slot)
    slot = pool.acquire()
    pool.stage(slot, "model_states.pt", [torch.ones(1024).untyped_storage()])
    pool.forget_unused(slot, {"model_states.pt"})  # layer_00.pt is gone from this save
    assert shared.take_dropped() == [1]
    assert set(slot.buffers) == {"model_states.pt"} and len(slot.views) == 1
    shared.close()


def test_the_saver_side_forgets_a_dropped_buffer():
    shared = SharedBuffers()
    shared.allocate(4096)
    [(ident, nbytes, fd)] = shared.take_unsent()
    Buffers.add(ident, nbytes, fd)
    assert ident in Buffers.table
    Buffers.forget([ident, 999])  # an id it never had is no error
    assert ident not in Buffers.table
    shared.close()
