"""A four-stage lineage (CPT→SFT, SFT→RM, SFT→RL, RM→RL) recorded through the API, read
back through the store, the `baton lineage` CLI and MLflow's own client."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from baton.cli import main as baton
from lineage.store import LineageStore

BATON = Path(sys.executable).with_name("baton")


@pytest.fixture(scope="module")
def built(four_stage_run):
    run_dir, mlf, ids = four_stage_run
    return run_dir, mlf, ids


@pytest.fixture
def cli(built, capsys):
    run_dir = built[0]

    def call(*argv: str) -> tuple[int, str, str]:
        code = baton([*argv, f"run.dir={run_dir}"])
        out = capsys.readouterr()
        return code, out.out, out.err
    return call


def test_the_rl_handoff_records_why_the_top_scoring_checkpoint_lost(built):
    run_dir, _, ids = built
    with LineageStore.open(f"sqlite:///{run_dir / 'lineage.db'}") as store:
        handoff = store.handoff(ids["handoffs"]["rl"].id)
        chain = store.ancestry(ids["checkpoints"]["rl"][5].id)
    assert (handoff.from_stage, handoff.to_stage, handoff.chosen_step) == ("sft", "rl", 20)
    assert [(c.step, c.chosen, c.eligible) for c in handoff.candidates] == [
        (20, True, True), (10, False, True), (30, False, False)]
    assert [link.stage_run.stage for link in chain] == ["rl", "sft", "cpt"]


def test_lineage_show_prints_the_tree_of_the_latest_pipeline(cli):
    code, out, _ = cli("lineage", "show")
    assert code == 0
    for text in ("pipeline run 1 'baton'  completed", "CPT attempt 1", "SFT attempt 1",
                 "RM attempt 1", "RL attempt 1",
                 "criterion entropy_floor, chosen step 20 (checkpoint 5), entropy 1.3100",
                 "criterion max_pairwise_accuracy, chosen step 20",
                 "train data /data/chats.parquet  messages  950 rows  sha256:a1a1a1a1a1a1…  read "
                 "480 rows  keys messages=conversation",
                 "eval data /data/chats.parquet (held-out 0.05)  messages  50 rows"):
        assert text in out


def test_lineage_show_json_uses_the_records_field_names(cli, built):
    code, out, _ = cli("lineage", "show", "1", "--json")
    data = json.loads(out)
    assert code == 0
    assert data["pipeline_run"]["id"] == 1
    assert [s["stage"] for s in data["stage_runs"]] == ["cpt", "sft", "rm", "rl"]
    assert [c["step"] for c in data["stage_runs"][0]["checkpoints"]] == [10, 20, 30]
    rl = next(h for h in data["handoffs"] if h["criterion"] == "entropy_floor")
    assert {"id", "from_stage", "to_stage", "criterion", "criterion_params", "chosen_checkpoint_id",
            "chosen_step", "entropy", "reason", "carry_policy", "reshard", "equivalence",
            "candidates"} <= set(rl)
    assert rl["reshard"]["converter"] == "ds_to_universal"


def test_lineage_trace_by_path_walks_back_to_the_first_stage(cli, built):
    path = built[2]["checkpoints"]["rl"][10].path
    code, out, _ = cli("lineage", "trace", path)
    assert code == 0
    assert out.index("RL attempt 1") < out.index("SFT attempt 1") < out.index("CPT attempt 1")
    assert "first stage: no handoff" in out
    assert "also ← handoff 4 from RM" in out


def test_lineage_trace_json_lists_each_generation_with_its_handoff(cli, built):
    ckpt_id = built[2]["checkpoints"]["rl"][10].id
    code, out, _ = cli("lineage", "trace", str(ckpt_id), "--json")
    chain = json.loads(out)
    assert code == 0
    assert [(g["stage_run"]["stage"], g["checkpoint"]["step"]) for g in chain] == [
        ("rl", 10), ("sft", 20), ("cpt", 30)]
    assert [g["handoff"]["criterion"] if g["handoff"] else None for g in chain] == [
        "entropy_floor", "min_heldout_loss", None]


def test_lineage_handoff_shows_every_metric_and_marks_the_winner(cli, built):
    code, out, _ = cli("lineage", "handoff", str(built[2]["handoffs"]["rl"].id))
    assert code == 0
    for text in ("criterion: entropy_floor {\"min_entropy\": 1.0}", "entropy", "heldout_loss",
                 "pass_at_4", "score", "★ chosen", "entropy 0.42 < 1.0",
                 "why step 20 won: highest score among checkpoints with entropy >= 1.0"):
        assert text in out
    code, out, _ = cli("lineage", "handoff", str(built[2]["handoffs"]["rl"].id), "--json")
    data = json.loads(out)
    assert [c["step"] for c in data["candidates"] if c["chosen"]] == [20]


def test_unknown_ids_exit_2_with_a_message_naming_them(cli):
    code, out, err = cli("lineage", "handoff", "77")
    assert (code, out) == (2, "")
    assert "baton lineage: error: no handoff 77 in sqlite:///" in err
    code, _, err = cli("lineage", "trace", "/no/such/step-000001")
    assert code == 2 and "no checkpoint at path '/no/such/step-000001'" in err
    code, _, err = cli("lineage", "show", "9")
    assert code == 2 and "no pipeline run 9" in err


def test_the_installed_baton_command_prints_the_same_tree(built):
    result = subprocess.run([str(BATON), "lineage", "show", f"run.dir={built[0]}"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "RL attempt 1" in result.stdout


def test_an_unreachable_store_url_exits_2_without_the_password(capsys, tmp_path, monkeypatch):
    # The password moves into PGPASSWORD of this (the test's) process; scope it to the test.
    monkeypatch.delenv("PGPASSWORD", raising=False)
    code = baton(["lineage", "show", f"run.dir={tmp_path}",
                  "store.url=postgresql+psycopg://u:hunter2@127.0.0.1:1/x"])
    err = capsys.readouterr().err
    assert code == 2
    assert "cannot reach the lineage store at postgresql+psycopg://u:***@127.0.0.1:1/x" in err
    assert "hunter2" not in err


def test_db_current_reports_the_revision_and_head(cli):
    from lineage.schema import code_head
    code, out, _ = cli("db", "current")
    assert code == 0
    assert f"revision {code_head()}, code head {code_head()} (up to date)" in out


def test_mlflow_holds_a_parent_run_with_one_child_per_stage_run(built):
    _, mlf, ids = built
    parent = mlf.client.get_run(ids["parent_mlflow"])
    children = mlf.client.search_runs(
        [mlf.experiment_id()], f"tags.mlflow.parentRunId = '{ids['parent_mlflow']}'")
    assert sorted(r.data.tags["baton.stage"] for r in children) == ["cpt", "rl", "rm", "sft"]
    assert parent.info.status == "FINISHED"
    config = mlf.client.download_artifacts(ids["parent_mlflow"], "config/resolved.json")
    assert json.loads(Path(config).read_text())["seed"] == 1234
    assert "lineage/lineage.png" in [a.path for a in mlf.client.list_artifacts(
        ids["parent_mlflow"], "lineage")]
    history = mlf.client.get_metric_history(ids["mlflow_runs"]["sft"], "train/score")
    assert [m.step for m in history] == [10, 20, 30]


def test_the_rl_run_carries_the_handoff_tags_table_and_description(built):
    _, mlf, ids = built
    run = mlf.client.get_run(ids["mlflow_runs"]["rl"])
    tags = run.data.tags
    assert {k: tags[f"baton.handoff.{k}"] for k in
            ("criterion", "chosen_step", "entropy", "from_stage")} == {
        "criterion": "entropy_floor", "chosen_step": "20", "entropy": "1.3100",
        "from_stage": "sft"}
    assert tags["baton.handoff.rm.criterion"] == "max_pairwise_accuracy"
    assert "**Why:** highest score among checkpoints" in tags["mlflow.note.content"]
    assert "Handoff 4: rm → rl" in tags["mlflow.note.content"]
    table_path = f"handoff/{ids['handoffs']['rl'].id}-sft-to-rl-candidates.json"
    table = json.loads(Path(mlf.client.download_artifacts(run.info.run_id, table_path)).read_text())
    assert set(table["columns"]) >= {"step", "chosen", "metric.entropy", "metric.score"}


def test_checkpoints_are_external_logged_models_linking_stage_runs(built):
    _, mlf, ids = built
    models, ckpts = ids["models"], ids["checkpoints"]
    sft_outputs = mlf.client.get_run(ids["mlflow_runs"]["sft"]).outputs.model_outputs
    assert sorted(o.model_id for o in sft_outputs) == sorted(
        models[c.id] for c in ckpts["sft"].values())
    rl_inputs = mlf.client.get_run(ids["mlflow_runs"]["rl"]).inputs.model_inputs
    assert sorted(i.model_id for i in rl_inputs) == sorted(
        [models[ckpts["sft"][20].id], models[ckpts["rm"][20].id]])
    model = mlf.client.get_logged_model(models[ckpts["sft"][20].id])
    assert model.tags["mlflow.model.isExternal"] == "true"
    assert model.tags["baton.checkpoint.path"] == ckpts["sft"][20].path
    assert model.source_run_id == ids["mlflow_runs"]["sft"]
    assert model.params["step"] == "20"
    assert str(model.status) == "READY"
    files = {f.path for f in mlf.client.list_logged_model_artifacts(model.model_id)}
    assert files == {"MLmodel", "manifest.json", "baton_checkpoint.json"}
