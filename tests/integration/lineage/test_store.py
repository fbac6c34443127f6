"""The LineageStore verbs and queries, on SQLite and on PostgreSQL."""
from __future__ import annotations

import pytest

from core.errors import BatonError
from lineage.errors import InvalidValue, LineageConflict, UnknownRecord
from lineage.store import CandidateSpec
from lineage_four_stage import NoMlflow, build_four_stage


def _pipeline_and_stage(store, stage="cpt"):
    pipeline = store.record_pipeline_run("p", {"seed": 1}, "hash", 1, "v1",
                                         prefect_flow_run_id="flow-1")
    return pipeline, store.record_stage_run(pipeline.id, stage, {"world_size": 1})


def test_a_pipeline_run_round_trips_with_its_config_and_finish_status(store):
    pipeline = store.record_pipeline_run("baton", {"a": {"b": [1, 2]}}, "h" * 64, 7, "abc123",
                                         prefect_flow_run_id="f-1")
    store.set_pipeline_mlflow_run(pipeline.id, "ml-1")
    done = store.finish_pipeline_run(pipeline.id, "completed")
    again = store.pipeline_run(pipeline.id)
    assert again == done
    assert (again.config, again.seed, again.mlflow_run_id, again.status) == (
        {"a": {"b": [1, 2]}}, 7, "ml-1", "completed")
    assert again.ended_at >= again.started_at and again.started_at.tzinfo is not None
    assert store.latest_pipeline_run() == again and store.pipeline_runs() == [again]


def test_attempts_are_numbered_per_pipeline_and_stage(store):
    pipeline, first = _pipeline_and_stage(store)
    second = store.record_stage_run(pipeline.id, "cpt", {"world_size": 2})
    other = store.record_stage_run(pipeline.id, "sft", {"world_size": 1})
    assert (first.attempt, second.attempt, other.attempt) == (1, 2, 1)
    assert [s.id for s in store.stage_runs(pipeline.id)] == [first.id, second.id, other.id]


def test_a_resumed_attempt_records_the_checkpoint_it_resumed_from(store):
    pipeline, first = _pipeline_and_stage(store)
    ckpt = store.record_checkpoint(first.id, 10, "/c/10", "sha", 1, "deepspeed", {})
    store.finish_stage_run(first.id, "preempted")
    second = store.record_stage_run(pipeline.id, "cpt", {}, resumed_from_checkpoint_id=ckpt.id)
    later = store.record_checkpoint(second.id, 20, "/c/20", "sha", 1, "deepspeed", {})
    chain = store.ancestry(later.id)
    assert [(link.checkpoint.step, link.via) for link in chain] == [(20, "origin"), (10, "resume")]


def test_a_handoff_and_all_its_candidates_are_recorded_together(store):
    pipeline, run = _pipeline_and_stage(store)
    a = store.record_checkpoint(run.id, 10, "/c/a", "s", 1, "deepspeed", {}, metrics={"loss": 2.0})
    b = store.record_checkpoint(run.id, 20, "/c/b", "s", 1, "deepspeed", {}, metrics={"loss": 1.0})
    handoff = store.record_handoff(
        run.id, "sft", "min_heldout_loss", b.id, "lowest loss",
        [CandidateSpec(a.id, {"loss": 2.0}, rank=2), CandidateSpec(b.id, {"loss": 1.0}, rank=1)],
        entropy=1.5, carry_policy={"carried": ["weights"]})
    assert store.handoff(handoff.id) == handoff
    assert (handoff.from_stage, handoff.chosen_step, handoff.to_stage_run_id) == ("cpt", 20, None)
    assert [(c.step, c.chosen) for c in handoff.candidates] == [(20, True), (10, False)]
    sft = store.record_stage_run(pipeline.id, "sft", {}, handoff_id=handoff.id)
    assert sft.handoff_id == handoff.id
    assert store.handoff(handoff.id).to_stage_run_id == sft.id


def test_a_handoff_with_an_unknown_candidate_records_nothing(store):
    pipeline, run = _pipeline_and_stage(store)
    ckpt = store.record_checkpoint(run.id, 10, "/c/a", "s", 1, "deepspeed", {})
    with pytest.raises(UnknownRecord, match="no checkpoint 999"):
        store.record_handoff(run.id, "sft", "c", ckpt.id, "r",
                             [CandidateSpec(ckpt.id, {}), CandidateSpec(999, {})])
    assert store.handoffs(pipeline.id) == []


def test_a_chosen_checkpoint_must_be_one_of_the_candidates(store):
    _, run = _pipeline_and_stage(store)
    a = store.record_checkpoint(run.id, 10, "/c/a", "s", 1, "deepspeed", {})
    b = store.record_checkpoint(run.id, 20, "/c/b", "s", 1, "deepspeed", {})
    with pytest.raises(LineageConflict, match=rf"chosen checkpoint {b.id} is not among the "
                                              rf"candidates \[{a.id}\]"):
        store.record_handoff(run.id, "sft", "c", b.id, "r", [CandidateSpec(a.id, {})])


def test_linking_a_handoff_to_a_run_of_another_stage_is_refused(store):
    pipeline, run = _pipeline_and_stage(store)
    ckpt = store.record_checkpoint(run.id, 10, "/c/a", "s", 1, "deepspeed", {})
    handoff = store.record_handoff(run.id, "sft", "c", ckpt.id, "r", [])
    rm = store.record_stage_run(pipeline.id, "rm", {})
    with pytest.raises(LineageConflict, match=f"handoff {handoff.id} goes to stage 'sft' but "
                                              f"stage run {rm.id} is a 'rm' run"):
        store.link_handoff_to_stage_run(handoff.id, rm.id)


def test_unknown_ids_name_the_kind_the_id_and_how_to_list_records(store):
    for call, kind in [(lambda: store.handoff(4242), "handoff"),
                       (lambda: store.checkpoint(4242), "checkpoint"),
                       (lambda: store.ancestry(4242), "checkpoint"),
                       (lambda: store.stage_runs(4242), "pipeline run"),
                       (lambda: store.events(4242), "stage run"),
                       (lambda: store.record_stage_run(4242, "cpt", {}), "pipeline run")]:
        with pytest.raises(UnknownRecord) as info:
            call()
        assert isinstance(info.value, BatonError)
        assert (info.value.kind, info.value.key) == (kind, 4242)
        assert str(info.value).startswith(f"no {kind} 4242 in ")
        assert "baton lineage show" in str(info.value)
    with pytest.raises(UnknownRecord, match="no checkpoint at path '/nowhere/step-1'"):
        store.checkpoint_by_path("/nowhere/step-1")


def test_values_outside_the_schema_name_the_key_and_the_allowed_values(store):
    _, run = _pipeline_and_stage(store)
    with pytest.raises(InvalidValue, match="status='done': expected one of running, "
                                           "completed, failed, preempted"):
        store.finish_stage_run(run.id, "done")
    with pytest.raises(InvalidValue, match="format='zip': expected one of deepspeed, "
                                           "universal, hf"):
        store.record_checkpoint(run.id, 1, "/c", "s", 1, "zip", {})


def test_checkpoints_are_found_by_relative_or_absolute_path(store, tmp_path, monkeypatch):
    _, run = _pipeline_and_stage(store)
    monkeypatch.chdir(tmp_path)
    ckpt = store.record_checkpoint(run.id, 5, "cpt/step-000005", "s", 1, "universal", {})
    assert ckpt.path == str(tmp_path / "cpt" / "step-000005")
    assert store.checkpoint_by_path(tmp_path / "cpt" / "step-000005") == ckpt
    assert store.checkpoint_by_path("cpt/step-000005") == ckpt


def test_events_and_journal_segments_come_back_in_order(store):
    _, run = _pipeline_and_stage(store, "rl")
    store.record_event(run.id, "rollout", "failure", step=3, detail={"error": "timeout"})
    store.record_event(run.id, "rollout", "recovery", step=3)
    store.record_journal_segment(run.id, 10, 19, "/j/1", "c1", 80)
    store.record_journal_segment(run.id, 0, 9, "/j/0", "c0", 80)
    assert [(e.role, e.kind, e.detail) for e in store.events(run.id)] == [
        ("rollout", "failure", {"error": "timeout"}), ("rollout", "recovery", {})]
    assert [s.step_start for s in store.journal_segments(run.id)] == [0, 10]
    with pytest.raises(InvalidValue, match="step_end=1: expected >= step_start \\(5\\)"):
        store.record_journal_segment(run.id, 5, 1, "/j/x", "c", 0)


def test_ancestry_of_an_rl_checkpoint_goes_back_through_sft_to_cpt(store, tmp_path):
    ids = build_four_stage(store, tmp_path, NoMlflow())
    rl_ckpt = ids["checkpoints"]["rl"][10]
    chain = store.ancestry(rl_ckpt.id)
    assert [(link.stage_run.stage, link.checkpoint.step) for link in chain] == [
        ("rl", 10), ("sft", 20), ("cpt", 30)]
    assert [link.handoff and link.handoff.criterion for link in chain] == [
        "entropy_floor", "min_heldout_loss", None]
    assert [h.from_stage for h in chain[0].side_inputs] == ["rm"]
    rl_handoff = store.handoff(ids["handoffs"]["rl"].id)
    rejected = [c for c in rl_handoff.candidates if not c.eligible]
    assert [(c.step, c.rejection_reason) for c in rejected] == [(30, "entropy 0.42 < 1.0")]
    assert rl_handoff.entropy == pytest.approx(1.31)
