"""The whole pipeline (CPT -> SFT -> RM -> RL, Prefect's ephemeral API) on a small config:
four handoffs in lineage with criterion, chosen step and entropy; every handoff resharded
where the layout changes; `baton rerun` of each handoff reproduces bit for bit, two of them
on a simulated other machine (portable mode); every stage run's environment fingerprint in
lineage and MLflow; and a second pipeline in another run directory ends with identical
checkpoints and an identical `baton report`."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ckpt.content_digest import content_digest_of
from tests.conftest import EPHEMERAL_PREFECT, run_baton
from tests.integration.repro.machines import AVX2_MACHINE

pytestmark = pytest.mark.slow

SMALL = ["stage.max_steps=4", "stage.save_every=2", "stage.eval_every=2",
         "pipeline.handoffs.sft_rl.selection.probe_prompts=4",
         "pipeline.handoffs.cpt_sft.selection.probe_prompts=4",
         "pipeline.handoffs.sft_rm.selection.probe_prompts=4",
         "pipeline.handoffs.rm_rl.selection.probe_prompts=4"]


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("pipeline")
    # As a user's `baton run` without a Prefect server: on Prefect's temporary API. The
    # second pipeline and the re-runs use the test process's server (tests.integration.prefect_api).
    proc = run_baton("run", f"run.dir={run_dir}", *SMALL, timeout=1500, env=EPHEMERAL_PREFECT)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    return run_dir, proc.stdout


def test_the_pipeline_records_four_handoffs_with_criterion_step_and_entropy(pipeline_run):
    run_dir, stdout = pipeline_run
    assert "pipeline run #1 completed" in stdout
    # The last lines name the commands to run next on this very run, ready to copy.
    assert f"  baton report {run_dir}\n" in stdout and f"  baton ui run.dir={run_dir}\n" in stdout
    for handoff_id in (1, 2, 3, 4):
        assert f"  baton rerun --handoff {handoff_id} run.dir={run_dir}" in stdout
    shown = run_baton("lineage", "show", "--json", f"run.dir={run_dir}", check=True)
    tree = json.loads(shown.stdout)
    text = json.dumps(tree)
    for stage in ("cpt", "sft", "rm", "rl"):
        assert f'"stage": "{stage}"' in text
    handoffs = [json.loads(run_baton("lineage", "handoff", str(i), "--json", f"run.dir={run_dir}",
                                     check=True).stdout) for i in (1, 2, 3, 4)]
    pairs = {(h["from_stage"], h["to_stage"]): h for h in handoffs}
    assert set(pairs) == {("cpt", "sft"), ("sft", "rm"), ("sft", "rl"), ("rm", "rl")}
    assert pairs[("sft", "rl")]["criterion"] == "entropy_tolerance"
    assert pairs[("sft", "rm")]["carry_policy"]["new_parameters"] == ["score.weight"]
    assert pairs[("sft", "rl")]["carry_policy"]["reset"] == ["optimizer", "scheduler", "rng"]
    assert pairs[("rm", "rl")]["carry_policy"]["new_parameters"] == []
    for h in handoffs:
        assert h["chosen_step"] in (2, 4) and h["entropy"] > 0
        # Pinned where its stage saved it: no retention of that stage ever deletes it.
        pins = run_dir.glob(f"*/{h['from_stage']}/checkpoints/.pins/step-{h['chosen_step']:06d}--*.json")
        assert any(f"#{h['id']} of pipeline run" in p.read_text() for p in pins), h
        assert h["reshard"]["output_manifest_sha256"] and h["equivalence"]["passed"] is True
        assert h["reshard"]["output_content_digest"] == content_digest_of(h["reshard"]["output"])
    chosen = next(run_dir.glob(f"*/sft/checkpoints/step-{pairs[('sft', 'rl')]['chosen_step']:06d}"))
    shown = run_baton("ckpt", "inspect", str(chosen), check=True).stdout
    assert f"pinned (never deleted by retention): handoff sft_rl #{pairs[('sft', 'rl')]['id']}" in shown
    assert "metrics at step" in shown and "eval_loss" in shown
    # The default layouts differ across CPT -> SFT (1/0 -> 2/2) and SFT -> RL (2/2 -> 1/1).
    assert pairs[("cpt", "sft")]["reshard"]["target_parallel"] == {"world_size": 2, "zero_stage": 2}
    assert pairs[("sft", "rl")]["reshard"]["converter"] != "none (same layout)"
    human = run_baton("lineage", "show", f"run.dir={run_dir}", check=True).stdout
    assert "entropy_tolerance" in human and "chosen step" in human


def test_the_runs_prefect_database_started_from_the_migrated_template(pipeline_run):
    """`make install` migrated Prefect's database once (flows.prefect_template); the run's
    ephemeral API started from a copy, at the same migration, and recorded its flow there."""
    import sqlite3

    from flows.prefect_template import template_path

    run_dir, _ = pipeline_run
    assert template_path().is_file(), f"no {template_path()}: `make install` makes it"
    revision = "SELECT version_num FROM alembic_version"
    with sqlite3.connect(template_path()) as template:
        assert template.execute("SELECT count(*) FROM flow_run").fetchone() == (0,)
        head = template.execute(revision).fetchall()
    with sqlite3.connect(run_dir / ".prefect" / "prefect.db") as used:
        assert used.execute(revision).fetchall() == head
        assert used.execute("SELECT count(*) FROM flow_run").fetchone()[0] >= 1


@pytest.fixture(scope="module")
def second_pipeline_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("pipeline-again")
    proc = run_baton("run", f"run.dir={run_dir}", *SMALL, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    return run_dir


# Handoffs 1 (CPT -> SFT, two ranks) and 3 (SFT -> RL, with Ray actors) are re-run on a
# simulated AVX2-only machine: portable mode (the default, repro.isa=avx2) must reproduce
# them there. On an AVX512 host that machine runs other kernels; on an AVX2 host, the same.
@pytest.mark.parametrize("handoff_id,machine", [(1, "other"), (2, "here"), (3, "other"), (4, "here")])
def test_rerun_of_each_handoff_reproduces_bit_for_bit(pipeline_run, handoff_id, machine):
    run_dir, _ = pipeline_run
    proc = run_baton("rerun", "--handoff", str(handoff_id), f"run.dir={run_dir}", timeout=900,
                     env=AVX2_MACHINE if machine == "other" else None)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "REPRODUCED bit for bit" in proc.stdout
    if machine == "other":
        assert "environment differed: " in proc.stdout and "MKL_ENABLE_INSTRUCTIONS unset → AVX2" in proc.stdout


def test_every_stage_run_has_its_environment_fingerprint_in_lineage_and_mlflow(pipeline_run, tmp_path):
    from mlflow import MlflowClient

    from lineage.store import LineageStore

    run_dir, _ = pipeline_run
    with LineageStore.open(f"sqlite:///{run_dir / 'lineage.db'}", create=False) as store:
        runs = store.stage_runs(store.pipeline_runs()[0].id)
    assert {r.stage for r in runs} == {"cpt", "sft", "rm", "rl"}
    for run in runs:
        assert run.environment["repro_mode"] == "portable", run
        assert run.environment["cpu_capability"] == "AVX2" and run.environment["versions"]["torch"]
        params = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}").get_run(
            run.mlflow_run_id).data.params
        assert params["env.repro_mode"] == "portable" and params["env.cpu_capability"] == "AVX2"
        local = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}").download_artifacts(
            run.mlflow_run_id, "environment.json", str(tmp_path / str(run.id)))
        assert json.loads(Path(local).read_text())["config_hash"] == run.environment["config_hash"]


def test_a_second_pipeline_elsewhere_ends_identical_and_reports_the_same(pipeline_run, second_pipeline_run):
    from lineage.store import LineageStore

    first, _ = pipeline_run
    finals = []
    for run_dir in (first, second_pipeline_run):
        with LineageStore.open(f"sqlite:///{run_dir / 'lineage.db'}", create=False) as store:
            rl = next(r for r in store.stage_runs(1) if r.stage == "rl" and r.attempt == 1)
            finals.append(store.checkpoints(rl.id)[-1])
    proc = run_baton("ckpt", "diff", finals[0].path, finals[1].path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "IDENTICAL" in proc.stdout
    assert finals[0].content_digest == finals[1].content_digest
    assert finals[0].content_digest.startswith("cd1:")
    reports = [run_baton("report", str(d), check=True).stdout for d in (first, second_pipeline_run)]
    assert reports[0] == reports[1]
    assert "| SFT → RL | entropy_tolerance |" in reports[0] and "greedy accuracy" in reports[0]


def test_mlflow_shows_the_handoff_on_the_downstream_run_and_links_the_chosen_model(pipeline_run):
    from mlflow import MlflowClient

    run_dir, _ = pipeline_run
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("baton")
    # Attempt 1 is the pipeline's own RL run (re-runs add later attempts).
    [rl] = client.search_runs([experiment.experiment_id],
                              "tags.`baton.stage` = 'rl' and tags.`baton.attempt` = '1'")
    rl = client.get_run(rl.info.run_id)
    tags = rl.data.tags
    assert tags["baton.handoff.criterion"] == "entropy_tolerance"
    assert tags["baton.handoff.from_stage"] == "sft" and tags["baton.handoff.chosen_step"] in ("2", "4")
    assert float(tags["baton.handoff.entropy"]) > 0
    assert tags["baton.handoff.input_content_digest"].startswith("cd1:")
    assert tags["baton.handoff.rm.criterion"] == "best_score"
    inputs = {client.get_logged_model(m.model_id).tags["baton.stage"]
              for m in rl.inputs.model_inputs}
    assert inputs == {"sft", "rm"}


def test_the_rl_journal_is_indexed_in_lineage_and_mlflow(pipeline_run, tmp_path):
    from mlflow import MlflowClient

    from lineage.store import LineageStore

    run_dir, _ = pipeline_run
    with LineageStore.open(f"sqlite:///{run_dir / 'lineage.db'}", create=False) as store:
        pipeline = store.pipeline_runs()[0]
        rl = next(r for r in store.stage_runs(pipeline.id) if r.stage == "rl")  # attempt 1
        segments = store.journal_segments(rl.id)
        assert [(s.step_start, s.step_end) for s in segments] == [(1, 1), (2, 2), (3, 3), (4, 4)]
        assert all(s.sample_count == 16 * 8 and len(s.checksum) == 64 for s in segments)
        syncs = [e for e in store.events(rl.id) if e.kind == "weight_sync"]
        assert [e.detail["version"] for e in syncs] == [0, 1, 2, 3]
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("baton")
    [run] = client.search_runs([experiment.experiment_id],
                               "tags.`baton.stage` = 'rl' and tags.`baton.attempt` = '1'")
    local = client.download_artifacts(run.info.run_id, "rl/journal.json", str(tmp_path))
    journal = json.loads(Path(local).read_text())
    assert [s["step"] for s in journal["segments"]] == [1, 2, 3, 4]
    syncs = [e for e in journal["events"] if e["kind"] == "weight_sync"]
    assert [(e["segment"], e["version"]) for e in syncs] == [(1, 0), (2, 1), (3, 2), (4, 3)]
    # The rollout/trainer mismatch of every step is in MLflow too (stages.rl.mismatch).
    history = {key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
               for key in ("logp_diff_mean", "logp_diff_max", "token_mult_prob_error")}
    assert sorted(history["logp_diff_max"]) == [1, 2, 3, 4]
    for step, mean in history["logp_diff_mean"].items():
        assert 0 <= mean <= history["logp_diff_max"][step]
        assert history["token_mult_prob_error"][step] == pytest.approx(math.exp(mean))
