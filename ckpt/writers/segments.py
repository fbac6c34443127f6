"""Segments as byte views: tensors and buffers in, checked contiguous memoryviews out.

Both writers take their buffers through here, and the checks (and their messages) match
the native module's, so the two backends reject the same inputs the same way.
"""
from __future__ import annotations

import sys
from typing import Sequence


def check_arguments(size: int, chunk_bytes: int, threads: int) -> None:
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be > 0, got {chunk_bytes}")
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")


def byte_view(buffer) -> memoryview:
    """A flat, read-only byte view of `buffer` that keeps it alive (no copy)."""
    torch = sys.modules.get("torch")  # a tensor can only exist if torch is imported
    if torch is not None:
        if isinstance(buffer, torch.UntypedStorage):
            buffer = torch.empty(0, dtype=torch.uint8, device=buffer.device).set_(buffer)
        if isinstance(buffer, torch.Tensor):
            return memoryview(_tensor_bytes(buffer, torch.uint8))
    view = memoryview(buffer)
    if not view.c_contiguous:
        raise ValueError(f"segment buffer must be C-contiguous, got a {type(buffer).__name__} "
                         f"with strides {view.strides}")
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _tensor_bytes(tensor, uint8):
    if tensor.dtype == uint8 and tensor.dim() == 1 and not tensor.requires_grad \
            and tensor.device.type == "cpu" and tensor.is_contiguous():
        return tensor.numpy()  # a staging buffer's bytes (ckpt.file_image.as_bytes): as they are
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        raise ValueError(f"segment buffer must be a contiguous CPU tensor, got one on "
                         f"{tensor.device} with strides {tuple(tensor.stride())}")
    # .numpy() shares the memory and holds the tensor: the view keeps both alive.
    return tensor.detach().reshape(-1).view(uint8).numpy()


def checked_views(size: int, segments: Sequence[tuple[int, object]]) -> list[tuple[int, memoryview]]:
    """(offset, byte view) per segment, after checking that they tile [0, size) in order."""
    views, expected = [], 0
    for item in segments:
        if len(item) != 2:
            raise ValueError("each segment must be (offset, buffer)")
        offset, buffer = item
        view = byte_view(buffer)
        if offset != expected:
            raise ValueError(f"segments must be sorted and contiguous from 0: expected "
                             f"offset {expected}, got {offset}")
        views.append((offset, view))
        expected += view.nbytes
    if expected != size:
        raise ValueError(f"segments cover [0, {expected}) but the file size is {size}")
    return views
