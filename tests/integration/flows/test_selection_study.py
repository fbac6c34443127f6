"""`baton study selection` on a tiny config: the study's bookkeeping, not its conclusion.

A CPT -> SFT pipeline leaves four committed SFT checkpoints; the study runs a 2-step RL
from three of them (two at a time, real Ray and DeepSpeed workers per candidate) and
must: run every candidate exactly once, compute its correlations from the outcomes it
recorded, and leave a completed study in lineage (candidates linked to checkpoints) and
in MLflow (a study run with one child run per candidate). Bad input is refused before
any RL compute. A pipeline with `selection.criterion=study` then picks at SFT -> RL by
the study's winning diagnostic and records which study it used.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_baton

# About 5 minutes of CPU on 2 cores.
pytestmark = [pytest.mark.slow]

PROBES = [f"pipeline.handoffs.{h}.selection.probe_prompts=4" for h in ("cpt_sft", "sft_rl")]
# 16 held-out prompts x 8 samples: enough that the candidates' rewards differ, so the study
# names a winning diagnostic for the criterion test (portable mode makes them the same on
# every run).
TINY_RL = "'stage.global_batch=4','stage.eval_samples=16','stage.group_size=4'"
CPT_SFT = ["pipeline.parallel.sft=single", *PROBES,
           "+pipeline.overrides.cpt=['stage.max_steps=2','stage.save_every=2']",
           "+pipeline.overrides.sft=['stage.max_steps=8','stage.save_every=2','stage.keep_last=4']"]
PIPELINE = [*CPT_SFT, f"+pipeline.overrides.rl=[{TINY_RL}]"]
STEPS = [2, 4, 8]


@pytest.fixture(scope="module")
def study(tmp_path_factory, ray_address):
    run_dir = tmp_path_factory.mktemp("study")
    run_baton("run", f"run.dir={run_dir}", "--stages", "cpt,sft", *PIPELINE, check=True, timeout=900)
    # The candidates' RL runs share the module's Ray instance (one start instead of three).
    # No warm spare: nothing here fails over, and it is one more process importing torch.
    proc = run_baton("study", "selection", f"run.dir={run_dir}", *PIPELINE, f"rl.ray.address={ray_address}",
                     "rl.rollout.spares=0", f"study.steps=[{','.join(map(str, STEPS))}]", "study.rl_steps=2",
                     "study.bootstrap=200", timeout=1200)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    return run_dir, proc.stdout + proc.stderr


def _store(run_dir: Path):
    from lineage.store import LineageStore
    return LineageStore.open(f"sqlite:///{run_dir / 'lineage.db'}", create=False)


def test_every_candidate_runs_rl_once_and_its_outcome_is_recorded(study):
    run_dir, stdout = study
    directory = run_dir / "studies" / "selection-0001"
    assert sorted(p.name for p in directory.glob("step-*")) == [f"step-{s:06d}" for s in STEPS]
    with _store(run_dir) as store:
        record = store.study(1)
        checkpoints = {c.id: c for c in store.checkpoints(record.from_stage_run_id)}
    assert record.status == "completed" and record.kind == "selection"
    assert sorted(c.step for c in record.candidates) == STEPS
    for cand in record.candidates:
        assert checkpoints[cand.checkpoint_id].step == cand.step  # linked to the real checkpoint
        root = directory / f"step-{cand.step:06d}"
        assert cand.rl_run_dir == str(root)
        launch = json.loads((root / "rl" / "launch.json").read_text())
        assert launch["config"]["stage"]["init_from"] == checkpoints[cand.checkpoint_id].path
        evals = [json.loads(line) for line in (root / "rl" / "metrics.jsonl").read_text().splitlines()]
        evals = [e for e in evals if "eval_reward" in e]
        assert [e["step"] for e in evals] == [0, 2]  # one run: no repeated or resumed steps
        assert cand.outcome["start_reward"] == evals[0]["eval_reward"]
        assert cand.outcome["final_reward"] == evals[1]["eval_reward"]
        assert {"sft_score", "heldout_loss", "entropy", "pass@1", "pass@k",
                "reward_variance"} <= set(cand.diagnostics)
    for step in STEPS:
        assert f"candidate step {step}: held-out reward" in stdout


def test_correlations_are_computed_from_the_recorded_outcomes(study):
    from handoff.study import CandidateResult, analyze

    run_dir, stdout = study
    with _store(run_dir) as store:
        record = store.study(1)
    again = analyze([CandidateResult(c.step, c.checkpoint_id, "", dict(c.diagnostics),
                                     dict(c.outcome)) for c in record.candidates],
                    resamples=200, seed=1234)
    assert json.loads(json.dumps(again.as_dict())) == record.results
    assert record.winner_diagnostic == (again.winner.diagnostic if again.winner else None)
    directory = run_dir / "studies" / "selection-0001"
    assert json.loads((directory / "study.json").read_text())["correlations"] == record.results["correlations"]
    assert (directory / "verdict.md").read_text() == record.verdict
    assert record.verdict.strip() in stdout
    shown = run_baton("lineage", "study", f"run.dir={run_dir}", check=True).stdout
    assert shown.startswith("study #1 (selection) of stage run #") and record.verdict.strip() in shown
    pngs = sorted(directory.glob("*.png"))
    assert len(pngs) >= 2 and all(p.stat().st_size > 1000 for p in pngs)


def test_the_study_is_in_mlflow_with_one_child_run_per_candidate(study):
    from mlflow.tracking import MlflowClient

    run_dir, _ = study
    with _store(run_dir) as store:
        record = store.study(1)
    client = MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}")
    parent = client.get_run(record.mlflow_run_id)
    assert parent.data.tags["baton.study_id"] == "1"
    children = client.search_runs([parent.info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert sorted(int(r.data.params["step"]) for r in children) == STEPS
    assert {c.mlflow_run_id for c in record.candidates} == {r.info.run_id for r in children}
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert "verdict.md" in artifacts and any(a.endswith(".png") for a in artifacts)


@pytest.mark.parametrize("bad, expected", [
    (["study.steps=[2,4]"], "at least 3 distinct checkpoint steps"),
    (["study.steps=[2,4,10]"], "no committed checkpoint at step 10"),
    (["study.stage_run_id=1"], "is a cpt run"),
])
def test_bad_input_is_refused_before_any_rl_compute(study, bad, expected):
    run_dir, _ = study
    proc = run_baton("study", "selection", f"run.dir={run_dir}", *PIPELINE, *bad, timeout=600)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text
    assert expected in text and "Traceback" not in text
    assert not (run_dir / "studies" / "selection-0002").exists()
    with _store(run_dir) as store:
        assert [s.id for s in store.studies()] == [1]


def test_criterion_study_picks_by_the_winning_diagnostic_and_records_the_study(study, ray_address):
    run_dir, _ = study
    with _store(run_dir) as store:
        record = store.study(1)
    # SFT from the base model (no CPT: it adds nothing to this check), then the handoff.
    proc = run_baton("run", f"run.dir={run_dir}", "--stages", "sft,rl", *CPT_SFT,
                     "selection@pipeline.handoffs.sft_rl.selection=study",
                     f"+pipeline.overrides.rl=['stage.max_steps=1',{TINY_RL}]",
                     f"rl.ray.address={ray_address}", "rl.rollout.spares=0", timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    with _store(run_dir) as store:
        handoff = [h for p in store.pipeline_runs() for h in store.handoffs(p.id)
                   if h.to_stage == "rl"][-1]
    from handoff.study import diagnostics_from_handoff_metrics, pick_by_study
    expected = pick_by_study([(c.step, diagnostics_from_handoff_metrics(c.metrics))
                              for c in handoff.candidates],
                             record.winner_diagnostic, record.winner_direction)
    assert handoff.chosen_step == expected  # by the winner, in the winner's direction
    assert handoff.criterion == "study"
    assert handoff.criterion_params["study"]["study_id"] == 1
    assert handoff.criterion_params["study"]["diagnostic"] == record.winner_diagnostic
    assert "selection study #1" in handoff.reason and record.winner_diagnostic in handoff.reason


def test_criterion_study_without_a_study_stops_before_any_stage(tmp_path):
    proc = run_baton("run", f"run.dir={tmp_path}", "selection@pipeline.handoffs.sft_rl.selection=study")
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text
    assert "holds no completed selection study" in text and "Traceback" not in text
    assert not any(tmp_path.glob("pipeline-*"))


def test_a_candidate_whose_rl_run_fails_fails_the_study_with_a_clear_error(study):
    """Runs last: it records study #2, which must not be the one criterion=study uses. The
    candidates' RL stages point at a Ray address where nothing listens, so each fails in
    its first seconds, as a real RL failure would fail later."""
    run_dir, _ = study
    proc = run_baton("study", "selection", f"run.dir={run_dir}", *PIPELINE, "rl.ray.address=127.0.0.1:9",
                     "study.steps=[2,4,6]", "study.rl_steps=2", "study.bootstrap=200", timeout=900)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text[-4000:]
    assert "baton study: error: baton study selection: the RL run of candidate step" in text
    assert "study-candidate.log" in text and "Traceback" not in text
    with _store(run_dir) as store:
        assert store.study(2).status == "failed" and store.latest_study().id == 1
