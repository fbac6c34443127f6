"""Deleting a checkpoint never leaves a `step-N` without its manifest, and what interrupted
saves and deletions leave behind is found and removed (no DeepSpeed, fast)."""
from __future__ import annotations

import json
import shutil

import pytest

from ckpt import cleanup, commit, manifest
from ckpt.layout import committed_steps, read_latest, step_dirname


def _fake_checkpoint(root, step):
    tmp = commit.clear_stale_tmp(root, step_dirname(step))
    tmp.mkdir(parents=True)
    files = {}
    for comp in manifest.REQUIRED:
        (tmp / f"{comp}.json").write_text(json.dumps({"step": step}))
        files[f"{comp}.json"] = {"size": (tmp / f"{comp}.json").stat().st_size,
                                 "sha256": manifest.sha256_file(tmp / f"{comp}.json")}
    return commit.commit(tmp, manifest.Manifest(
        stage="cpt", step=step, components={c: [f"{c}.json"] for c in manifest.REQUIRED},
        files=files, parallel={"world_size": 1, "zero_stage": 0}))


def test_retention_killed_mid_delete_leaves_a_deleting_directory_not_a_broken_step(
        tmp_path, monkeypatch):
    for step in (1, 2, 3):
        _fake_checkpoint(tmp_path, step)

    def killed_halfway(path, ignore_errors=False):
        (path / manifest.MANIFEST).unlink()  # the delete had got this far
        raise KeyboardInterrupt("killed")
    monkeypatch.setattr(commit.shutil, "rmtree", killed_halfway)
    with pytest.raises(KeyboardInterrupt):
        commit.apply_retention(tmp_path, keep_last=2)
    monkeypatch.undo()

    assert not (tmp_path / "step-000001").exists()
    assert (tmp_path / "step-000001.deleting").is_dir()
    assert [p.name for p in committed_steps(tmp_path)] == ["step-000002", "step-000003"]
    assert [(left.path.name, left.why) for left in cleanup.find_leftovers(tmp_path)] == [
        ("step-000001.deleting", "a deletion that never finished")]


def test_every_kind_of_leftover_is_removed_and_nothing_else(tmp_path):
    kept = [_fake_checkpoint(tmp_path, 1), _fake_checkpoint(tmp_path, 2)]
    (tmp_path / "step-000003.tmp" / "rng").mkdir(parents=True)
    (tmp_path / "step-000000.deleting").mkdir()
    shutil.copytree(kept[0], tmp_path / "step-000004")
    (tmp_path / "step-000004" / manifest.MANIFEST).unlink()
    (tmp_path / "latest.tmp").write_text("step-000003")
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "step-final").mkdir()

    removed = cleanup.remove_leftovers(tmp_path)
    assert [(left.path.name, left.why) for left in removed] == [
        ("latest.tmp", "a pointer move that never finished"),
        ("step-000000.deleting", "a deletion that never finished"),
        ("step-000003.tmp", "a save that never committed"),
        ("step-000004", "a step directory without a manifest")]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "latest", "notes.txt", "step-000001", "step-000002", "step-final"]
    assert read_latest(tmp_path) == kept[1]
    assert cleanup.find_leftovers(tmp_path) == []
