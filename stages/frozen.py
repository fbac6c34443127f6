"""Frozen helper models of RL (the reference policy, the reward model): loaded from a
checkpoint (or the model directory) with gradients off, and their identity for the
checkpoint's RL state (a resumed run must use the same ones)."""
from __future__ import annotations

from pathlib import Path

from stages.errors import WrongModelCheckpoint
from stages.model import load_model_and_tokenizer


def checkpoint_identity(path: str | None, model_dir) -> dict:
    """What a frozen model was loaded from: checkpoint path + manifest sha256 (or the
    model directory itself when no checkpoint was given)."""
    from ckpt.manifest import checksum_of
    from ckpt.layout import MANIFEST

    if path is None:
        return {"path": str(Path(model_dir).resolve()), "manifest_sha256": None}
    return {"path": str(Path(path).resolve()),
            "manifest_sha256": checksum_of(Path(path) / MANIFEST)}


def frozen_model(model_class, model_dir, path: str | None, role: str):
    from ckpt.weights import load_weights_into

    model, _ = load_model_and_tokenizer(model_dir, model_class)
    if path is not None:
        report = load_weights_into(model, path, allow_new_head=True)
        if report["new"]:
            raise WrongModelCheckpoint(path, role, report["new"], type(model).__name__,
                                       "rm" if role == "reward_model" else "sft")
    return model.eval().requires_grad_(False)
