"""The identity of RL's frozen models (reference, reward model) in a checkpoint's RL state:
what they hold, never where they lie, so a resume from a moved copy is accepted and one
from other weights is refused (fast: small checkpoints of JSON files, no model load)."""
from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest

from ckpt import commit, content_hash, manifest
from ckpt.content_digest import content_digest_of
from ckpt.errors import IncompatibleCheckpoint
from ckpt.layout import step_dirname
from stages.frozen import (CHECKPOINT, MODEL_DIR, checkpoint_identity, legacy_identity,
                           model_dir_digest, same_frozen_model)
from stages.rl.objective import JOURNAL, KL_CONTROLLER, REFERENCE, REWARD_MODEL, RlObjective

SCHEME = content_hash.scheme()


def _checkpoint(root, weights: str = "w1"):
    tmp = commit.clear_stale_tmp(root, step_dirname(4))
    tmp.mkdir(parents=True)
    files = {}
    for comp in manifest.REQUIRED:
        (tmp / f"{comp}.json").write_text(json.dumps({comp: weights}))
        files[f"{comp}.json"] = content_hash.hash_file(tmp / f"{comp}.json", SCHEME)
    return commit.commit(tmp, manifest.Manifest(
        stage="sft", step=4, components={c: [f"{c}.json"] for c in manifest.REQUIRED},
        files=files, parallel={"world_size": 1, "zero_stage": 0}, hashing=SCHEME,
        extra={"parent": {"init_from": str(root)}}))


def _model_dir(path, weights: bytes = b"weights"):
    path.mkdir(parents=True)
    (path / "config.json").write_text('{"hidden_size": 8}')
    (path / "model.safetensors").write_bytes(weights)
    return path


def test_a_checkpoint_identity_is_its_content_digest_and_holds_no_path(tmp_path):
    sft = _checkpoint(tmp_path / "a")
    identity = checkpoint_identity(str(sft), tmp_path / "model")
    assert identity == {"loaded_from": CHECKPOINT, "content_digest": content_digest_of(sft)}
    assert str(tmp_path) not in json.dumps(identity)


def test_a_moved_copy_has_the_same_identity_and_other_weights_another(tmp_path):
    sft = _checkpoint(tmp_path / "a")
    moved = tmp_path / "elsewhere" / sft.name
    shutil.copytree(sft, moved)
    other = _checkpoint(tmp_path / "b", weights="w2")
    assert checkpoint_identity(str(moved), None) == checkpoint_identity(str(sft), None)
    assert checkpoint_identity(str(other), None) != checkpoint_identity(str(sft), None)


def test_a_model_directory_is_identified_by_its_files_not_its_place(tmp_path):
    a, b = _model_dir(tmp_path / "a" / "model"), _model_dir(tmp_path / "b" / "model")
    (b / ".cache").mkdir()
    (b / ".cache" / "download.lock").write_text("tool state")
    other = _model_dir(tmp_path / "c" / "model", b"other weights")
    renamed = _model_dir(tmp_path / "d" / "model")
    (renamed / "model.safetensors").rename(renamed / "weights.safetensors")
    assert checkpoint_identity(None, a) == {"loaded_from": MODEL_DIR,
                                            "content_digest": model_dir_digest(b)}
    assert model_dir_digest(a).startswith("md1:")
    assert model_dir_digest(other) != model_dir_digest(a) != model_dir_digest(renamed)


def test_an_older_checkpoint_identity_is_compared_by_path_and_manifest_sha256(tmp_path):
    sft = _checkpoint(tmp_path / "a")
    current = checkpoint_identity(str(sft), None)
    assert same_frozen_model(legacy_identity(str(sft), None), current, str(sft), None)
    old_other_place = {**legacy_identity(str(sft), None), "path": "/somewhere/else"}
    assert not same_frozen_model(old_other_place, current, str(sft), None)
    assert same_frozen_model(None, None, None, None)
    assert not same_frozen_model(None, current, str(sft), None)


def _objective(reference: str, model_dir) -> RlObjective:
    """An RlObjective with only what load_state_dict uses (no model, tokenizer or roles)."""
    objective = RlObjective.__new__(RlObjective)
    objective.model_dir, objective.frozen_from = model_dir, {REFERENCE: reference}
    objective.identities = {REFERENCE: checkpoint_identity(reference, model_dir)}
    objective.kl = SimpleNamespace(load_state_dict=lambda state: None)
    objective.steps = SimpleNamespace(load_journal_state=lambda state: None)
    return objective


def test_a_resume_accepts_a_moved_reference_and_refuses_other_weights(tmp_path):
    sft = _checkpoint(tmp_path / "a")
    saved = {KL_CONTROLLER: {}, JOURNAL: None, REFERENCE: checkpoint_identity(str(sft), None)}
    moved = tmp_path / "elsewhere" / sft.name
    shutil.copytree(sft, moved)
    _objective(str(moved), None).load_state_dict(saved)
    other = _checkpoint(tmp_path / "b", weights="w2")
    with pytest.raises(IncompatibleCheckpoint) as refused:
        _objective(str(other), None).load_state_dict(saved)
    message = str(refused.value)
    assert message.startswith(f"{other}: RL reference differs from the checkpoint's: saved ")
    assert content_digest_of(sft) in message and content_digest_of(other) in message
    assert "resume with stage.reference_from set as it was" in message


def test_a_resume_refuses_a_reward_model_the_checkpoint_did_not_have(tmp_path):
    sft = _checkpoint(tmp_path / "a")
    objective = _objective(str(sft), None)
    objective.frozen_from[REWARD_MODEL] = str(sft)
    objective.identities[REWARD_MODEL] = checkpoint_identity(str(sft), None)
    saved = {KL_CONTROLLER: {}, JOURNAL: None, REFERENCE: checkpoint_identity(str(sft), None)}
    with pytest.raises(IncompatibleCheckpoint, match="RL reward_model differs .*: saved None"):
        objective.load_state_dict(saved)
