"""Retention by metric and pinned checkpoints (ckpt.retention), without DeepSpeed."""
from __future__ import annotations

import json

from ckpt import commit, manifest
from ckpt.layout import committed_steps, step_dirname
from ckpt.retention import KeepBest, best, pin, pinned, pins_of


def _checkpoint(root, step, metrics=None):
    tmp = commit.clear_stale_tmp(root, step_dirname(step))
    tmp.mkdir(parents=True)
    files = {}
    for comp in manifest.REQUIRED:
        rel = f"{comp}.json"
        content = {"step": step, **({"metrics": metrics} if comp == "meta" and metrics else {})}
        (tmp / rel).write_text(json.dumps(content))
        files[rel] = {"size": (tmp / rel).stat().st_size, "sha256": manifest.sha256_file(tmp / rel)}
    m = manifest.Manifest(stage="sft", step=step, components={c: [f"{c}.json"] for c in manifest.REQUIRED},
                          files=files, parallel={"world_size": 1, "zero_stage": 0})
    return commit.commit(tmp, m)


def _names(root):
    return [p.name for p in committed_steps(root)]


def test_the_best_by_a_loss_stay_beside_the_newest(tmp_path):
    losses = {2: 0.9, 4: 0.5, 6: 0.7, 8: 0.6, 10: 0.8}
    for step, loss in losses.items():
        _checkpoint(tmp_path, step, {"eval_loss": loss})
    commit.apply_retention(tmp_path, keep_last=1, keep_best=KeepBest(2, "eval_loss", "min"))
    assert _names(tmp_path) == ["step-000004", "step-000008", "step-000010"]


def test_max_mode_ties_go_to_the_newer_and_unranked_checkpoints_are_not_best(tmp_path):
    _checkpoint(tmp_path, 1, {"eval_reward": 0.5})
    _checkpoint(tmp_path, 2, {"eval_reward": 0.7})
    _checkpoint(tmp_path, 3, {"eval_reward": float("nan")})  # not a finite number: not ranked
    _checkpoint(tmp_path, 4)                                   # saved without an evaluation
    _checkpoint(tmp_path, 5, {"eval_reward": 0.7})
    _checkpoint(tmp_path, 6, {"eval_reward": 0.1})
    steps = committed_steps(tmp_path)
    assert {p.name for p in best(steps, KeepBest(1, "eval_reward", "max"))} == {"step-000005"}
    assert {p.name for p in best(steps, KeepBest(3, "eval_reward", "max"))} == {
        "step-000001", "step-000002", "step-000005"}
    assert best(steps, KeepBest(2, "eval_loss", "min")) == set()  # no checkpoint has it


def test_a_pinned_checkpoint_survives_every_retention_and_says_why(tmp_path):
    for step in (1, 2, 3, 4):
        _checkpoint(tmp_path, step, {"eval_loss": 1.0 / step})
    chosen = tmp_path / step_dirname(1)
    pin(chosen, "handoff sft_rl #3 of pipeline run 1")
    pin(chosen, "handoff sft_rl #3 of pipeline run 1")  # idempotent
    pin(chosen, "stage rl in runs/x started from it")
    assert pinned(tmp_path) == {chosen}
    assert len(pins_of(chosen)) == 2 and set(pins_of(chosen)) == {"handoff sft_rl #3 of pipeline run 1",
                                    "stage rl in runs/x started from it"}
    removed = commit.apply_retention(tmp_path, keep_last=1, keep_best=KeepBest(1, "eval_loss", "min"))
    assert [p.name for p in removed] == ["step-000002", "step-000003"]
    assert _names(tmp_path) == ["step-000001", "step-000004"]
    assert pins_of(tmp_path / step_dirname(4)) == []
