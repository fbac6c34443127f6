"""The state's bytes copied into one reused buffer, as cheaply as torch allows from Python:
what the bound of a checkpoint-every-step run copies (bench.every_step)."""
from __future__ import annotations

import torch


def _plain_buffer(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8)


class StateCopy:
    """`copy()` fills `buffer` with the state's tensors' bytes, one after another.
    `allocate(nbytes)` makes the buffer: a uint8 tensor of that many bytes."""

    def __init__(self, state, allocate=_plain_buffer):
        self.tensors = [t.detach() for t in state.tensors()]
        sizes = [t.numel() * t.element_size() for t in self.tensors]
        self.buffer = allocate(sum(sizes))
        self.views = list(torch.split(self.buffer, sizes))
        # Byte views of the live tensors, made once (the optimizer updates them in place):
        # one foreach call then copies them all, without a Python loop to inflate a bound.
        contiguous = all(t.is_contiguous() for t in self.tensors)
        self.sources = ([t.reshape(-1).view(torch.uint8) for t in self.tensors]
                        if contiguous else None)

    def copy(self) -> None:
        if self.sources is not None:
            torch._foreach_copy_(self.views, self.sources)
            return
        for view, tensor in zip(self.views, self.tensors):
            view.copy_(tensor.reshape(-1).view(torch.uint8))
