"""Frozen helper models of RL (the reference policy, the reward model): loaded from a
checkpoint (or the model directory) with gradients off, and their identity for the
checkpoint's RL state (a resumed run must use the same ones).

The identity is what the frozen model holds, never where it lies: it is written into
`objective.json`, a state file, so a path in it would make two reproductions of one
run in two run directories differ. Where a frozen model was loaded from is recorded
for people in the checkpoint's meta.json (`config.stage.reference_from`,
`init_from`, `reward_model_from`), which is informational only.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from stages.errors import WrongModelCheckpoint
from stages.model import load_model_and_tokenizer

CHECKPOINT, MODEL_DIR = "checkpoint", "model_dir"
MODEL_DIR_PREFIX = "md1:"


def model_dir_digest(model_dir) -> str:
    """`md1:<sha256>` over the model directory's files: sorted relative names, each with
    its sha256. Hidden entries are left out: they are tool caches (huggingface_hub's
    `.cache/`), not the model."""
    from ckpt.manifest import sha256_file

    root, digest = Path(model_dir), hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root)
        if any(part.startswith(".") for part in rel.parts):
            continue
        digest.update(f"{rel.as_posix()}\0{sha256_file(path)}\n".encode())
    return MODEL_DIR_PREFIX + digest.hexdigest()


def checkpoint_identity(path: str | None, model_dir) -> dict:
    """What a frozen model holds: the content digest of its checkpoint
    (ckpt.content_digest), or of the model directory when no checkpoint was given."""
    if path is None:
        return {"loaded_from": MODEL_DIR, "content_digest": model_dir_digest(model_dir)}
    from ckpt.content_digest import content_digest_of

    return {"loaded_from": CHECKPOINT, "content_digest": content_digest_of(path)}


def legacy_identity(path: str | None, model_dir) -> dict:
    """The identity checkpoints written before content digests recorded (path + manifest
    sha256): what a resume from such a checkpoint is compared with."""
    from ckpt.layout import MANIFEST
    from ckpt.manifest import checksum_of

    if path is None:
        return {"path": str(Path(model_dir).resolve()), "manifest_sha256": None}
    return {"path": str(Path(path).resolve()),
            "manifest_sha256": checksum_of(Path(path) / MANIFEST)}


def same_frozen_model(saved: dict | None, current: dict | None, path: str | None,
                      model_dir) -> bool:
    """Whether a checkpoint's recorded identity names the frozen model this run loaded
    from `path` (None: the model directory). An identity without a content digest is
    an older checkpoint's, compared the way it was written."""
    if saved is None or current is None:
        return saved == current
    if "content_digest" not in saved:
        return saved == legacy_identity(path, model_dir)
    return saved == current


def frozen_model(model_class, model_dir, path: str | None, role: str):
    from ckpt.weights import load_weights_into

    model, _ = load_model_and_tokenizer(model_dir, model_class)
    if path is not None:
        report = load_weights_into(model, path, allow_new_head=True)
        if report["new"]:
            raise WrongModelCheckpoint(path, role, report["new"], type(model).__name__,
                                       "rm" if role == "reward_model" else "sft")
    return model.eval().requires_grad_(False)
