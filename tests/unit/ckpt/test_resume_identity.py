"""A resume's model check (ckpt.compat.check_resumable): the identity is computed only when
the model directory's files differ from those the checkpoint was written with."""
from __future__ import annotations

import json

import pytest

from ckpt import commit, manifest
from ckpt.compat import check_resumable
from ckpt.errors import IncompatibleCheckpoint
from ckpt.layout import step_dirname

SAVED = {"model_type": "llama", "hidden_size": 128, "rope_theta": 10000.0}
PARALLEL = {"world_size": 1, "zero_stage": 0}


def _checkpoint(root, model_files):
    tmp = commit.clear_stale_tmp(root, step_dirname(4, 0))
    tmp.mkdir(parents=True)
    files = {}
    for component in manifest.REQUIRED:
        rel = f"{component}.json"
        body = {"model": SAVED, "model_files": model_files} if component == "meta" else {"step": 4}
        (tmp / rel).write_text(json.dumps(body))
        files[rel] = {"size": (tmp / rel).stat().st_size, "sha256": manifest.sha256_file(tmp / rel)}
    m = manifest.Manifest(stage="cpt", step=4, components={c: [f"{c}.json"] for c in manifest.REQUIRED},
                          files=files, parallel=PARALLEL)
    return commit.commit(tmp, m)


def _never():
    raise AssertionError("the identity was computed although the model files are the same")


def test_the_same_model_files_skip_computing_the_identity(tmp_path):
    check_resumable(_checkpoint(tmp_path, "mf1:same"), "cpt", PARALLEL, _never, model_files="mf1:same")


def test_other_model_files_compute_it_and_a_different_model_is_refused_by_key(tmp_path):
    path = _checkpoint(tmp_path, "mf1:old")
    computed = []

    def identity():
        computed.append(True)
        return {**SAVED, "rope_theta": 500000.0}

    with pytest.raises(IncompatibleCheckpoint, match="rope_theta: checkpoint has 10000.0, this run has 500000.0"):
        check_resumable(path, "cpt", PARALLEL, identity, model_files="mf1:new")
    assert computed == [True]
    # Equal identities from other files (a copied model directory) resume.
    check_resumable(path, "cpt", PARALLEL, lambda: dict(SAVED), model_files="mf1:new")


def test_a_checkpoint_written_before_model_files_were_recorded_computes_it(tmp_path):
    path = _checkpoint(tmp_path, None)
    with pytest.raises(IncompatibleCheckpoint, match="hidden_size"):
        check_resumable(path, "cpt", PARALLEL, {**SAVED, "hidden_size": 64}, model_files="mf1:x")
