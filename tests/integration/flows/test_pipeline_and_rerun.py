"""The whole pipeline (CPT -> SFT -> RM -> RL, Prefect's ephemeral API) on a small config:
four handoffs in lineage with criterion, chosen step and entropy; every handoff resharded
where the layout changes; and `baton rerun` of each handoff reproduces bit for bit."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_baton

pytestmark = pytest.mark.slow

SMALL = ["stage.max_steps=4", "stage.save_every=2", "stage.eval_every=2",
         "pipeline.handoffs.sft_rl.selection.probe_prompts=4",
         "pipeline.handoffs.cpt_sft.selection.probe_prompts=4",
         "pipeline.handoffs.sft_rm.selection.probe_prompts=4",
         "pipeline.handoffs.rm_rl.selection.probe_prompts=4"]


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("pipeline")
    proc = run_baton("run", f"run.dir={run_dir}", *SMALL, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    return run_dir, proc.stdout


def test_the_pipeline_records_four_handoffs_with_criterion_step_and_entropy(pipeline_run):
    run_dir, stdout = pipeline_run
    assert "pipeline run #1 completed" in stdout
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
        assert h["reshard"]["output_manifest_sha256"] and h["equivalence"]["passed"] is True
    # The default layouts differ across CPT -> SFT (1/0 -> 2/2) and SFT -> RL (2/2 -> 1/1).
    assert pairs[("cpt", "sft")]["reshard"]["target_parallel"] == {"world_size": 2, "zero_stage": 2}
    assert pairs[("sft", "rl")]["reshard"]["converter"] != "none (same layout)"
    human = run_baton("lineage", "show", f"run.dir={run_dir}", check=True).stdout
    assert "entropy_tolerance" in human and "chosen step" in human


@pytest.mark.parametrize("handoff_id", [1, 2, 3, 4])
def test_rerun_of_each_handoff_reproduces_bit_for_bit(pipeline_run, handoff_id):
    run_dir, _ = pipeline_run
    proc = run_baton("rerun", "--handoff", str(handoff_id), f"run.dir={run_dir}", timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "REPRODUCED bit for bit" in proc.stdout


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
