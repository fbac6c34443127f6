"""The best-scoring SFT checkpoint is excluded by the entropy criterion, and the lineage
record (and `baton lineage handoff`) says why."""
from __future__ import annotations

import json

from handoff.selection import Candidate, select
from lineage import CandidateSpec, LineageStore
from tests.conftest import run_baton

# A converged SFT run: score keeps rising while the policy's entropy collapses.
SFT_TRAJECTORY = [  # step, accuracy, entropy
    (25, 0.10, 1.60), (50, 0.30, 1.10), (75, 0.42, 0.62), (100, 0.46, 0.21), (125, 0.47, 0.08)]


def _candidates():
    return [Candidate(path=f"/ckpt/sft/step-{s:06d}", step=s,
                      metrics={"accuracy": a, "entropy": e, "heldout_loss": 1.0 - a})
            for s, a, e in SFT_TRAJECTORY]


def test_entropy_floor_excludes_the_best_scoring_checkpoint_and_records_why(tmp_path):
    candidates = _candidates()
    chosen, reason = select(candidates, "entropy_floor", score_metric="accuracy", entropy_floor=0.5)
    best_by_score = max(candidates, key=lambda c: c.metrics["accuracy"])
    assert best_by_score.step == 125 and chosen.step == 75
    assert "among candidates with entropy >= 0.5000" in reason

    store = LineageStore.open(f"sqlite:///{tmp_path / 'lineage.db'}")
    pipeline = store.record_pipeline_run("t", {}, "h", 1, "test")
    sft = store.record_stage_run(pipeline.id, "sft", {"world_size": 2, "zero_stage": 2})
    ids = {c.path: store.record_checkpoint(sft.id, c.step, c.path, "sha", 1, "deepspeed", {}).id
           for c in candidates}
    handoff = store.record_handoff(
        sft.id, "rl", "entropy_floor", ids[chosen.path], reason,
        [CandidateSpec(ids[c.path], c.metrics, c.eligible, c.rejection, c.rank) for c in candidates],
        criterion_params={"entropy_floor": 0.5}, entropy=chosen.metrics["entropy"])

    shown = run_baton("lineage", "handoff", str(handoff.id), "--json", f"run.dir={tmp_path}", check=True)
    record = json.loads(shown.stdout)
    assert record["chosen_step"] == 75 and record["criterion"] == "entropy_floor"
    assert abs(record["entropy"] - 0.62) < 1e-9
    best = next(c for c in record["candidates"] if c["metrics"]["accuracy"] == 0.47)
    assert best["eligible"] is False
    assert best["rejection_reason"].startswith("entropy 0.0800 below floor 0.5000")
    assert "collapsed policy" in best["rejection_reason"]
    text = run_baton("lineage", "handoff", str(handoff.id), f"run.dir={tmp_path}", check=True).stdout
    assert "entropy 0.0800 below floor 0.5000" in text


def test_entropy_tolerance_prefers_the_highest_entropy_near_the_best_score():
    chosen, reason = select(_candidates(), "entropy_tolerance", score_metric="accuracy",
                            score_tolerance=0.05)
    assert chosen.step == 75
    assert "highest entropy 0.6200 among candidates within 0.05" in reason


def test_best_score_takes_the_peak_and_latest_the_newest():
    assert select(_candidates(), "best_score", score_metric="accuracy")[0].step == 125
    assert select(_candidates(), "latest", score_metric="accuracy")[0].step == 125
    assert select(_candidates(), "best_score", score_metric="-heldout_loss")[0].step == 125
