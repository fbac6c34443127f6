"""Staging buffers in shared memory: another mapping of the same descriptor sees what the
worker wrote, ids are never reused, and each descriptor is handed over once."""
from __future__ import annotations

import mmap
import os

import pytest
import torch

from ckpt.shared_buffers import SharedBuffers


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
