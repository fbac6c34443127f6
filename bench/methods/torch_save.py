"""`torch.save` of the state into one file, then fsync: the plain PyTorch baseline."""
from __future__ import annotations

import os

import torch

from bench.methods.base import SaveMethod


class TorchSave(SaveMethod):
    name = "torch.save + fsync"

    def save(self) -> None:
        with open(self.next_path(), "wb") as handle:
            torch.save(self.state.state_dict(), handle)
            handle.flush()
            os.fsync(handle.fileno())
