"""Selection studies: recorded through the store (SQLite and PostgreSQL) and mirrored in a
real MLflow tracking store as a parent run with one child run per candidate."""
from __future__ import annotations

import json
import uuid

import pytest

from lineage.errors import InvalidValue, LineageConflict, UnknownRecord

STEPS = (10, 20, 30)
DIAGNOSTICS = {10: {"entropy": 1.9, "pass@1": 0.30}, 20: {"entropy": 1.3, "pass@1": 0.45},
               30: {"entropy": 0.4, "pass@1": 0.50}}
OUTCOMES = {10: {"start_reward": 0.30, "final_reward": 0.62, "gain": 0.32},
            20: {"start_reward": 0.45, "final_reward": 0.70, "gain": 0.25},
            30: {"start_reward": 0.50, "final_reward": 0.55, "gain": 0.05}}
CORRELATIONS = [
    {"diagnostic": "entropy", "target": "gain", "spearman": 1.0, "spearman_lo": 0.5,
     "spearman_hi": 1.0, "kendall": 1.0, "kendall_lo": 0.33, "kendall_hi": 1.0},
    {"diagnostic": "pass@1", "target": "gain", "spearman": -1.0, "spearman_lo": -1.0,
     "spearman_hi": -0.5, "kendall": -1.0, "kendall_lo": -1.0, "kendall_hi": -0.33},
]
VERDICT = "### Selection study\n\nStart RL from the checkpoint with the **highest entropy**.\n"


def _sft_run(store):
    pipeline = store.record_pipeline_run("p", {}, "hash", 1, "v1")
    run = store.record_stage_run(pipeline.id, "sft", {"world_size": 1})
    ckpts = {step: store.record_checkpoint(run.id, step, f"/sft/step-{step}", "sha", 1,
                                           "deepspeed", {}) for step in STEPS}
    return pipeline, run, ckpts


def _finished_study(store, run, ckpts, *, status="completed", winner="entropy"):
    study = store.start_study("selection", run.id, {"k": len(ckpts), "rl": {"steps": 20}})
    for step, ckpt in ckpts.items():
        store.record_study_candidate(study.id, ckpt.id, step, DIAGNOSTICS[step])
    return store.finish_study(study.id, status, results={"correlations": CORRELATIONS},
                              winner_diagnostic=winner, winner_direction=1 if winner else None,
                              verdict=VERDICT)


def test_a_selection_study_records_candidates_outcomes_and_its_winner(store, tmp_path):
    _, run, ckpts = _sft_run(store)
    study = store.start_study("selection", run.id, {"k": 3})
    assert (study.kind, study.status, study.candidates, study.ended_at) == (
        "selection", "running", (), None)
    store.record_study_candidate(study.id, ckpts[30].id, 30, DIAGNOSTICS[30],
                                 outcome=OUTCOMES[30], rl_run_dir=tmp_path / "rl-30")
    for step in (10, 20):
        store.record_study_candidate(study.id, ckpts[step].id, step, DIAGNOSTICS[step])
        store.set_study_candidate_outcome(study.id, ckpts[step].id, OUTCOMES[step],
                                          tmp_path / f"rl-{step}")
    done = store.finish_study(study.id, "completed", results={"correlations": CORRELATIONS},
                              winner_diagnostic="entropy", winner_direction=1, verdict=VERDICT)
    assert store.study(study.id) == done
    assert (done.status, done.winner_diagnostic, done.winner_direction, done.verdict) == (
        "completed", "entropy", 1, VERDICT)
    assert done.results == {"correlations": CORRELATIONS} and done.config == {"k": 3}
    assert done.ended_at >= done.created_at and done.created_at.tzinfo is not None
    assert [(c.step, c.checkpoint_id, c.diagnostics, c.outcome, c.rl_run_dir)
            for c in done.candidates] == [
        (step, ckpts[step].id, DIAGNOSTICS[step], OUTCOMES[step], str(tmp_path / f"rl-{step}"))
        for step in STEPS]


def test_the_latest_study_is_the_newest_completed_one_with_a_winner(store):
    pipeline, run, ckpts = _sft_run(store)
    assert store.latest_study() is None
    chosen = _finished_study(store, run, ckpts)
    _finished_study(store, run, ckpts, winner=None)           # completed, no winner
    _finished_study(store, run, ckpts, status="failed")       # failed, with a winner
    store.start_study("selection", run.id, {})                # still running
    assert store.latest_study() == chosen
    assert store.latest_study("selection", from_stage_run_id=run.id) == chosen
    other = store.record_stage_run(pipeline.id, "sft", {"world_size": 2})
    other_ckpts = {10: store.record_checkpoint(other.id, 10, "/sft2/10", "s", 1, "deepspeed", {})}
    newer = _finished_study(store, other, other_ckpts)
    assert store.latest_study() == newer
    assert store.latest_study(from_stage_run_id=run.id) == chosen
    assert store.latest_study(from_stage_run_id=4242) is None
    listed = store.studies()
    assert [s.id for s in listed] == sorted((s.id for s in listed), reverse=True)
    assert len(listed) == 5 and store.studies("selection") == listed


def test_an_unknown_kind_or_stage_run_is_refused_and_records_nothing(store):
    _, run, _ = _sft_run(store)
    with pytest.raises(InvalidValue, match="kind='ablation': expected one of selection"):
        store.start_study("ablation", run.id, {})
    with pytest.raises(UnknownRecord) as info:
        store.start_study("selection", 4242, {})
    assert (info.value.kind, info.value.key) == ("stage run", 4242)
    assert str(info.value).startswith("no stage run 4242 in ")
    assert "baton lineage show" in str(info.value)
    with pytest.raises(UnknownRecord, match="no study 4242 in "):
        store.study(4242)
    with pytest.raises(InvalidValue, match="kind='ablation': expected one of selection"):
        store.latest_study("ablation")
    assert store.studies() == []


def test_bad_candidates_outcomes_and_winners_are_refused_with_the_fix(store):
    _, run, ckpts = _sft_run(store)
    study = store.start_study("selection", run.id, {})
    store.record_study_candidate(study.id, ckpts[10].id, 10, DIAGNOSTICS[10])
    with pytest.raises(LineageConflict, match=rf"checkpoint {ckpts[10].id} is already a "
                                              rf"candidate of study {study.id}; set its outcome "
                                              "with set_study_candidate_outcome"):
        store.record_study_candidate(study.id, ckpts[10].id, 10, DIAGNOSTICS[10])
    with pytest.raises(UnknownRecord, match="no checkpoint 4242 in "):
        store.record_study_candidate(study.id, 4242, 10, {})
    with pytest.raises(InvalidValue, match=r"outcome=\{'gain': 0.1\}: expected a mapping with "
                                           r"start_reward, final_reward, gain \(missing "
                                           r"start_reward, final_reward\)"):
        store.set_study_candidate_outcome(study.id, ckpts[10].id, {"gain": 0.1})
    with pytest.raises(UnknownRecord, match=rf"no study candidate \({study.id}, {ckpts[20].id}\)"
                                            r" in .*record it first with record_study_candidate"):
        store.set_study_candidate_outcome(study.id, ckpts[20].id, OUTCOMES[20])
    with pytest.raises(InvalidValue, match="winner_direction=0: expected \\+1 \\(higher is "
                                           "better\\) or -1 \\(lower is better\\)"):
        store.finish_study(study.id, "completed", winner_diagnostic="entropy", winner_direction=0)
    with pytest.raises(InvalidValue, match="winner_direction=None: expected \\+1 or -1 with "
                                           "winner_diagnostic='entropy'"):
        store.finish_study(study.id, "completed", winner_diagnostic="entropy")
    with pytest.raises(InvalidValue, match="winner_diagnostic='x{60}': expected at most 50 "
                                           "characters"):
        store.finish_study(study.id, "completed", winner_diagnostic="x" * 60, winner_direction=-1)
    with pytest.raises(InvalidValue, match="status='running': expected one of completed, failed"):
        store.finish_study(study.id, "running")
    store.finish_study(study.id, "failed")
    for late in (lambda: store.finish_study(study.id, "completed"),
                 lambda: store.record_study_candidate(study.id, ckpts[20].id, 20, {}),
                 lambda: store.set_study_candidate_outcome(study.id, ckpts[10].id, OUTCOMES[10])):
        with pytest.raises(LineageConflict, match=rf"study {study.id} is (already )?failed"):
            late()


def test_undefined_correlations_are_stored_as_null_on_every_backend(store):
    _, run, ckpts = _sft_run(store)
    study = store.start_study("selection", run.id, {})
    store.record_study_candidate(study.id, ckpts[10].id, 10, {"entropy": float("nan")})
    done = store.finish_study(study.id, "completed", results={"correlations": [
        {"diagnostic": "entropy", "target": "gain", "spearman": float("nan")}]})
    assert done.results["correlations"][0]["spearman"] is None
    assert store.study(study.id).candidates[0].diagnostics == {"entropy": None}


def test_mlflow_run_ids_of_the_study_and_its_candidates_are_recorded(store):
    _, run, ckpts = _sft_run(store)
    study = _finished_study(store, run, ckpts)
    children = {ckpt.id: f"child-{step}" for step, ckpt in ckpts.items()}
    recorded = store.set_study_mlflow(study.id, "parent-run", children)
    assert recorded.mlflow_run_id == "parent-run"
    assert {c.checkpoint_id: c.mlflow_run_id for c in recorded.candidates} == children
    assert store.study(study.id) == recorded
    with pytest.raises(UnknownRecord, match=rf"no study candidate \({study.id}, 4242\)"):
        store.set_study_mlflow(study.id, "parent-run", {4242: "x"})


@pytest.fixture(scope="module")
def tracking(tmp_path_factory):
    """One MLflow tracking store for the module; each test logs to its own experiment."""
    root = tmp_path_factory.mktemp("mlflow")
    return f"sqlite:///{root / 'mlflow.db'}", root / "mlartifacts"


def test_log_study_makes_a_parent_run_and_one_child_run_per_candidate(store, tracking, tmp_path):
    from mlflow import MlflowClient

    from lineage.mlflow_bridge import MlflowLineage
    _, run, ckpts = _sft_run(store)
    study = store.start_study("selection", run.id, {"k": 3, "rl": {"steps": 20}})
    for step, ckpt in ckpts.items():
        store.record_study_candidate(study.id, ckpt.id, step, DIAGNOSTICS[step], OUTCOMES[step])
    study = store.finish_study(study.id, "completed", results={"correlations": CORRELATIONS},
                               winner_diagnostic="entropy", winner_direction=1, verdict=VERDICT)
    plot, table = tmp_path / "entropy_vs_gain.png", tmp_path / "correlations.json"
    plot.write_bytes(b"\x89PNG\r\n\x1a\n")
    table.write_text(json.dumps(CORRELATIONS))
    view = MlflowLineage(tracking[0], str(tracking[1]), experiment=f"study-{uuid.uuid4().hex}")
    parent_id, children = view.log_study(study, [plot, table])
    store.set_study_mlflow(study.id, parent_id, children)

    client = MlflowClient(tracking_uri=tracking[0])
    parent = client.get_run(parent_id)
    assert (parent.info.run_name, parent.info.status) == (f"study-selection-{study.id}", "FINISHED")
    assert {k: parent.data.tags[k] for k in ("baton.kind", "baton.study_id",
                                             "baton.from_stage_run_id")} == {
        "baton.kind": "study", "baton.study_id": str(study.id),
        "baton.from_stage_run_id": str(run.id)}
    assert {k: parent.data.params[k] for k in ("K", "kind", "config.k", "config.rl.steps")} == {
        "K": "3", "kind": "selection", "config.k": "3", "config.rl.steps": "20"}
    assert parent.data.metrics["spearman.gain.entropy"] == 1.0
    assert parent.data.metrics["kendall_lo.gain.pass_at_1"] == -1.0
    assert len([k for k in parent.data.metrics]) == 12
    assert {a.path for a in client.list_artifacts(parent_id)} == {
        "verdict.md", "entropy_vs_gain.png", "correlations.json"}
    verdict = client.download_artifacts(parent_id, "verdict.md", str(tmp_path / "dl"))
    assert open(verdict).read() == VERDICT

    found = client.search_runs([parent.info.experiment_id],
                               f"tags.mlflow.parentRunId = '{parent_id}'")
    assert {r.info.run_id for r in found} == set(children.values())
    assert set(children) == {ckpt.id for ckpt in ckpts.values()}
    for step, ckpt in ckpts.items():
        child = client.get_run(children[ckpt.id])
        assert (child.info.run_name, child.info.status) == (f"candidate-step-{step}", "FINISHED")
        assert child.data.params == {"step": str(step), "checkpoint_id": str(ckpt.id)}
        assert child.data.metrics == pytest.approx({
            "entropy": DIAGNOSTICS[step]["entropy"], "pass_at_1": DIAGNOSTICS[step]["pass@1"],
            **OUTCOMES[step]})
    recorded = store.study(study.id)
    assert recorded.mlflow_run_id == parent_id
    assert {c.checkpoint_id: c.mlflow_run_id for c in recorded.candidates} == children


def test_log_study_refuses_a_missing_artifact_before_logging_anything(store, tracking, tmp_path):
    from lineage.mlflow_bridge import MlflowLineage
    from lineage.mlflow_study import mlflow_key
    _, run, ckpts = _sft_run(store)
    study = _finished_study(store, run, ckpts)
    view = MlflowLineage(tracking[0], str(tracking[1]), experiment=f"study-{uuid.uuid4().hex}")
    with pytest.raises(InvalidValue, match="artifacts='.*missing.png': expected files or "
                                           "directories that exist"):
        view.log_study(study, [tmp_path / "missing.png"])
    assert view.client.search_runs([view.experiment_id()]) == []
    assert mlflow_key("spearman", "gain", "pass@1 (k=4)") == "spearman.gain.pass_at_1__k_4_"
