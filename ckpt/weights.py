"""Full model weights out of a verified checkpoint (to start the next stage from it).

Nothing here trusts the pickles: ZeRO 0-2 weights are a weights_only load of checked
bytes; ZeRO-3 weights are gathered by DeepSpeed's `zero_to_fp32` from a private copy
written from checked bytes, under a forced weights_only load (ckpt.safe_load).
"""
from __future__ import annotations

from pathlib import Path

import torch

from ckpt import manifest as manifest_io
from ckpt.errors import IncompatibleCheckpoint
from ckpt.reader import CheckpointReader, pickle_files, private_copy
from ckpt.safe_load import forced_safe_load

MODEL_STATES = "mp_rank_00_model_states.pt"


def consolidated_state_dict(directory: str | Path) -> dict[str, torch.Tensor]:
    """fp32 weights of the whole model, whatever ZeRO stage saved them."""
    directory = Path(directory)
    manifest = manifest_io.verify(directory)  # every checksum before any unpickling
    reader = CheckpointReader(directory, manifest)
    if manifest.layout.zero_stage == 3:
        return _zero3_weights(reader)
    states = reader.torch(MODEL_STATES)
    return {k: v.float() for k, v in states["module"].items()}


def _zero3_weights(reader: CheckpointReader) -> dict[str, torch.Tensor]:
    """DeepSpeed's own gather of the fp32 partitions; it opens files by path, so it gets
    a copy no one else can swap, and cannot unpickle anything outside the allow-list."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    with private_copy(reader, pickle_files(reader.manifest)) as copy, \
            forced_safe_load(reader.directory):
        return get_fp32_state_dict_from_zero_checkpoint(str(copy.parent), tag=copy.name)


def _is_backbone(model, key: str) -> bool:
    prefix = getattr(model, "base_model_prefix", "")
    return bool(prefix) and key.startswith(prefix + ".")


def _tied_to_loaded(own: dict, key: str, state: dict) -> bool:
    """A tied parameter (an `lm_head` sharing the embedding, which Hugging Face saves once)
    is loaded through the twin it shares storage with."""
    ptr = own[key].data_ptr()
    return any(j != key and j in own and own[j].data_ptr() == ptr for j in state)


def load_weights_into(model, directory: str | Path,
                      allow_new_head: bool = False) -> dict[str, list[str]]:
    """Load a checkpoint's weights; return {"new": [...], "dropped": [...]}.

    Only heads may differ: a head the checkpoint has and the model lacks is dropped
    (a policy's `lm_head` under a reward model); a head the model has and the
    checkpoint lacks is new, allowed only with `allow_new_head` (a reward model's
    `score` starts fresh; a policy with a random `lm_head` would be useless). A backbone
    parameter missing or left over, or any shape mismatch, is always refused.
    """
    state = consolidated_state_dict(directory)
    own = model.state_dict()
    shapes = [f"{k}: checkpoint {tuple(v.shape)}, model {tuple(own[k].shape)}"
              for k, v in state.items() if k in own and own[k].shape != v.shape]
    new = sorted(k for k in own if k not in state and not _tied_to_loaded(own, k, state))
    dropped = sorted(k for k in state if k not in own)
    refused = [k for k in new + dropped if _is_backbone(model, k)]
    refused += [k for k in new if not allow_new_head and k not in refused]
    if shapes or refused:
        raise IncompatibleCheckpoint(directory, (
            f"weights do not fit the {type(model).__name__} being loaded: shape mismatches "
            f"{shapes[:5]}, parameters missing or unexpected {refused[:5]}; expected a "
            "checkpoint of the same model (see its meta.json 'model'; only a reward model "
            "may start from a policy checkpoint with a new head)"))
    model.load_state_dict(state, strict=False)
    return {"new": new, "dropped": dropped}
