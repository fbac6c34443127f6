"""Manifest, atomic commit and retention without DeepSpeed (fast)."""
from __future__ import annotations

import json

import pytest

from ckpt import commit, manifest
from ckpt.errors import CorruptCheckpoint, NotACheckpoint
from ckpt.layout import committed_steps, position_of, read_latest, step_dirname


def _fake_checkpoint(root, step, micro=0):
    name = step_dirname(step, micro)
    tmp = commit.clear_stale_tmp(root, name)
    tmp.mkdir(parents=True)
    files = {}
    for comp in manifest.REQUIRED:
        rel = f"{comp}.json"
        (tmp / rel).write_text(json.dumps({"step": step}))
        files[rel] = {"size": (tmp / rel).stat().st_size, "sha256": manifest.sha256_file(tmp / rel)}
    m = manifest.Manifest(stage="cpt", step=step, components={c: [f"{c}.json"] for c in manifest.REQUIRED},
                          files=files, parallel={"world_size": 1, "zero_stage": 0})
    return commit.commit(tmp, m)


def test_commit_renames_into_place_and_moves_latest(tmp_path):
    final = _fake_checkpoint(tmp_path, 3)
    assert final.name == "step-000003" and not (tmp_path / "step-000003.tmp").exists()
    assert read_latest(tmp_path) == final
    assert manifest.verify(final).step == 3


def test_retention_keeps_the_newest_even_with_keep_last_zero(tmp_path):
    for step in (1, 2, 3, 4):
        _fake_checkpoint(tmp_path, step)
    removed = commit.apply_retention(tmp_path, keep_last=0)
    assert [p.name for p in removed] == ["step-000001", "step-000002", "step-000003"]
    assert [p.name for p in committed_steps(tmp_path)] == ["step-000004"]


def test_deferred_retention_renames_out_of_the_step_namespace_and_deletes_later(tmp_path):
    for step in (1, 2, 3):
        _fake_checkpoint(tmp_path, step)
    deferred = []
    removed = commit.apply_retention(tmp_path, keep_last=1, deferred=deferred)
    assert [p.name for p in removed] == ["step-000001", "step-000002"]
    # Already no checkpoint any more (a reader never sees a half-deleted step-N) ...
    assert [p.name for p in committed_steps(tmp_path)] == ["step-000003"]
    # ... but its bytes are still there, for the caller to free off the critical path.
    assert [p.name for p in deferred] == ["step-000001.deleting", "step-000002.deleting"]
    assert all((p / "meta.json").is_file() for p in deferred)


def test_mid_accumulation_checkpoints_sort_after_their_step(tmp_path):
    for step, micro in ((2, 0), (2, 1), (1, 0)):
        _fake_checkpoint(tmp_path, step, micro)
    assert [p.name for p in committed_steps(tmp_path)] == [
        "step-000001", "step-000002", "step-000002-micro-01"]
    assert position_of("step-000002-micro-01") == (2, 1)


def test_unexpected_files_and_checksums_are_all_named_at_once(tmp_path):
    final = _fake_checkpoint(tmp_path, 1)
    (final / "stray.bin").write_bytes(b"x")
    (final / "rng.json").write_text('{"step": 9}')  # same size, different bytes
    with pytest.raises(CorruptCheckpoint) as err:
        manifest.verify(final)
    assert "unexpected file stray.bin" in str(err.value)
    assert "checksum mismatch in rng.json" in str(err.value)


def test_a_directory_that_is_not_there_is_not_a_checkpoint(tmp_path):
    with pytest.raises(NotACheckpoint, match="no such checkpoint directory"):
        manifest.verify(tmp_path / "step-000001")
