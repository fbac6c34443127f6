"""A FileImage filled with its storages' bytes is exactly what torch.save writes (CRC off)."""
from __future__ import annotations

import io
from collections import OrderedDict

import pytest
import torch

from ckpt.file_image import FileImage, crc32_off, image_of


def _assemble(image: FileImage, buffers) -> bytes:
    """What a writer puts on disk: each segment at its offset (uint8 tensors or bytes)."""
    out = bytearray(image.size)
    for offset, buffer in image.segments(buffers):
        data = buffer.numpy().tobytes() if isinstance(buffer, torch.Tensor) else bytes(buffer)
        out[offset:offset + len(data)] = data
    return bytes(out)


def _state():
    flat = torch.randn(64, dtype=torch.float32)
    return {"module": OrderedDict(w=torch.nn.Parameter(torch.randn(3, 5)), half=torch.ones(7, dtype=torch.bfloat16)),
            "views": [flat[:10], flat[10:30].view(4, 5), flat],  # three tensors, one storage
            "empty": torch.empty(0), "ints": torch.arange(9, dtype=torch.int64),
            "meta": {"step": 3, "shape": torch.Size([3, 4]), "names": ("a", "b"), "none": None}}


@pytest.fixture(autouse=True)
def _no_crc():
    crc32_off()


def test_filled_image_is_byte_identical_to_torch_save():
    state = _state()
    image = image_of(state)
    assert [n for _, n in image.holes] == [s.nbytes() for s in image.storages]
    assert len(image.storages) == 4  # w, half, the shared flat storage, ints (empty has none)
    expected = io.BytesIO()
    torch.save(state, expected)
    filled = _assemble(image, [torch.empty(0, dtype=torch.uint8).set_(s) for s in image.storages])
    assert filled == expected.getvalue()


def test_image_snapshots_structure_and_loads_back_with_sharing():
    state = _state()
    image = image_of(state)
    copies = [torch.empty(0, dtype=torch.uint8).set_(s).clone() for s in image.storages]
    state["meta"]["step"] = 99                      # changed after the capture: not in the file
    state["views"][2].add_(1.0)                      # nor this (the copies were taken before)
    loaded = torch.load(io.BytesIO(_assemble(image, copies)), weights_only=True)
    assert loaded["meta"]["step"] == 3
    assert torch.equal(loaded["views"][2] + 1.0, state["views"][2])
    assert loaded["views"][0].untyped_storage().data_ptr() == loaded["views"][2].untyped_storage().data_ptr()
    assert torch.equal(loaded["module"]["half"], state["module"]["half"])


def test_page_alignment_puts_every_storage_at_a_4096_offset_and_still_loads():
    state = _state()
    image = image_of(state, alignment=4096)
    assert all(offset % 4096 == 0 for offset, _ in image.holes)
    copies = [torch.empty(0, dtype=torch.uint8).set_(s).clone() for s in image.storages]
    loaded = torch.load(io.BytesIO(_assemble(image, copies)), weights_only=True)
    assert torch.equal(loaded["ints"], state["ints"])
    from torch.utils.serialization import config
    assert config.save.storage_alignment == 64  # restored for everyone else
