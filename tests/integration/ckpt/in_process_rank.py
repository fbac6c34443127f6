"""What the tests of asynchronous saves in one in-process rank share: the payload a
worker hands over besides the engine's state, and the weights a checkpoint holds."""
from __future__ import annotations

import torch

from ckpt.checkpointer import SavePayload
from ckpt.reader import CheckpointReader
from ckpt.state import RngState


def payload(step: int) -> SavePayload:
    progress = {"step": step, "micro_step": step, "micro_in_window": 0, "tokens_seen": 0,
                "samples_seen": 0}
    return SavePayload(progress=progress, data={"epoch": 0}, meta={"parent": None},
                       rng=RngState.state_dict())


def saved_weights(path) -> dict[str, torch.Tensor]:
    reader = CheckpointReader(path)
    model_file = next(rel for rel in reader.manifest.files if rel.endswith("model_states.pt"))
    return reader.torch(model_file)["module"]
