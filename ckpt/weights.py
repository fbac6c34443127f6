"""Full model weights out of a verified checkpoint (to start the next stage from it)."""
from __future__ import annotations

import io
from pathlib import Path

import torch

from ckpt import manifest as manifest_io


def consolidated_state_dict(directory: str | Path) -> dict[str, torch.Tensor]:
    """fp32 weights of the whole model, whatever ZeRO stage saved them."""
    directory = Path(directory)
    manifest = manifest_io.verify(directory)  # every checksum before any unpickling
    if manifest.parallel.get("zero_stage", 0) == 3:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
        return get_fp32_state_dict_from_zero_checkpoint(str(directory.parent), tag=directory.name)
    data = (directory / "mp_rank_00_model_states.pt").read_bytes()
    from ckpt.engine import _allow_deepspeed_globals
    _allow_deepspeed_globals()
    states = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    return {k: v.float() for k, v in states["module"].items()}


def load_weights_into(model, directory: str | Path) -> None:
    state = consolidated_state_dict(directory)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if "lm_head" not in k or "lm_head" in state]:
        raise manifest_io.CorruptCheckpoint(directory, [
            f"weights do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}"])
