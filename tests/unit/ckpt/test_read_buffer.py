"""A large file is read into a kernel-populated mapping (ckpt.content_hash.read_buffer):
the checked read still returns the file's bytes and catches a changed byte, and tensors
loaded in place from that mapping outlive every other reference to it."""
from __future__ import annotations

import gc

import torch

from ckpt import content_hash
from ckpt.safe_load import load_verified_bytes

HASHING = content_hash.scheme(chunk_bytes=1 << 20)


def test_a_large_file_is_read_whole_into_a_writable_mapping(tmp_path):
    path = tmp_path / "blob.bin"
    data = torch.randint(0, 256, (3 * content_hash.POPULATE_FROM_BYTES + 5,), dtype=torch.uint8)
    path.write_bytes(data.numpy().tobytes())
    entry = content_hash.hash_file(path, HASHING)
    buffer, problem = content_hash.read_checked(path, entry, HASHING)
    assert problem is None
    assert buffer.base is not None and buffer.flags.writeable  # the mapping, not np.empty
    assert buffer.tobytes() == path.read_bytes()

    changed = bytearray(path.read_bytes())
    changed[2 * (1 << 20) + 7] ^= 1
    path.write_bytes(bytes(changed))
    _, problem = content_hash.read_checked(path, entry, HASHING)
    assert problem is not None and problem.startswith("chunk 2 ")


def test_tensors_loaded_in_place_keep_the_mapping_alive(tmp_path):
    path = tmp_path / "state.pt"
    weights = torch.arange(1 << 19, dtype=torch.float32)  # 2 MiB: a mapped buffer
    torch.save({"w": weights}, path)
    entry = content_hash.hash_file(path, HASHING)
    buffer, problem = content_hash.read_checked(path, entry, HASHING)
    assert problem is None and buffer.base is not None
    loaded = load_verified_bytes(buffer, path)
    del buffer
    gc.collect()
    assert torch.equal(loaded["w"], weights)
    loaded["w"].add_(1)  # writable, as torch.load's tensors are
    assert torch.equal(loaded["w"], weights + 1)
