"""Builds a four-stage lineage (CPT→SFT, SFT→RM, SFT→RL, RM→RL) through the public API,
the way the pipeline flow records one. The SFT→RL handoff rejects the best-scoring
checkpoint because its entropy collapsed: the case the trainability criterion is for."""
from __future__ import annotations

import json
from pathlib import Path

from lineage.records import Checkpoint
from lineage.store import CandidateSpec, LineageStore
from stages.data.lineage import dataset_records

PARALLEL = {"cpt": {"world_size": 1, "zero_stage": 1}, "sft": {"world_size": 2, "zero_stage": 2},
            "rm": {"world_size": 1, "zero_stage": 0}, "rl": {"world_size": 2, "zero_stage": 1}}
# step -> metrics per stage
METRICS = {
    "cpt": {10: {"heldout_loss": 2.1, "entropy": 2.9}, 20: {"heldout_loss": 1.7, "entropy": 2.6},
            30: {"heldout_loss": 1.5, "entropy": 2.4}},
    "sft": {10: {"score": 0.41, "heldout_loss": 1.2, "entropy": 1.9, "pass_at_4": 0.5},
            20: {"score": 0.63, "heldout_loss": 1.0, "entropy": 1.31, "pass_at_4": 0.7},
            30: {"score": 0.71, "heldout_loss": 0.9, "entropy": 0.42, "pass_at_4": 0.72}},
    "rm": {10: {"pairwise_accuracy": 0.66}, 20: {"pairwise_accuracy": 0.78}},
    "rl": {5: {"reward": 0.3, "kl": 0.01}, 10: {"reward": 0.45, "kl": 0.03}},
}
CONFIG = {"run": {"name": "baton", "dir": "/tmp/x"}, "seed": 1234,
          "stage": {"max_steps": 30}, "parallel": {"world_size": 2}}


def _stage(store: LineageStore, mlf, root: Path, pipeline, parent_run: str, stage: str,
           handoff_id=None):
    run = store.record_stage_run(pipeline.id, stage, PARALLEL[stage], handoff_id=handoff_id)
    mlflow_id = mlf.start_stage(parent_run, run)
    store.set_stage_mlflow_run(run.id, mlflow_id)
    ckpts: dict[int, Checkpoint] = {}
    models: dict[int, str] = {}
    for step, metrics in METRICS[stage].items():
        mlf.log_metrics(mlflow_id, {f"train/{k}": v for k, v in metrics.items()}, step)
        path = root / stage / "checkpoints" / f"step-{step:06d}"
        path.mkdir(parents=True, exist_ok=True)
        (path / "manifest.json").write_text(json.dumps({"stage": stage, "step": step}))
        ckpt = store.record_checkpoint(run.id, step, path, f"sha256:{stage}{step}", 4096 * step,
                                       "deepspeed", PARALLEL[stage], tokens_seen=step * 768,
                                       metrics=metrics)
        ckpts[step] = ckpt
        models[ckpt.id] = mlf.log_checkpoint(mlflow_id, ckpt, path / "manifest.json")
    return run, mlflow_id, ckpts, models


def _handoff(store, src_run, to_stage, ckpts, criterion, params, chosen_step, reason,
             rejected=None):
    rejected = rejected or {}
    ranked = [s for s in sorted(ckpts, key=lambda s: s != chosen_step) if s not in rejected]
    cands = [CandidateSpec(ckpts[s].id, METRICS[src_run.stage][s], eligible=s not in rejected,
                           rejection_reason=rejected.get(s),
                           rank=ranked.index(s) + 1 if s in ranked else None) for s in ckpts]
    entropy = METRICS[src_run.stage][chosen_step].get("entropy")
    return store.record_handoff(
        src_run.id, to_stage, criterion, ckpts[chosen_step].id, reason, cands,
        criterion_params=params, entropy=entropy,
        carry_policy={"carried": ["weights"], "reset": ["optimizer", "scheduler", "rng"],
                      "new": {"lr": 1e-4}},
        reshard={"source": PARALLEL[src_run.stage], "target": PARALLEL[to_stage],
                 "converter": "ds_to_universal", "version": "0.18",
                 "input_manifest": "sha256:in", "output_manifest": "sha256:out"},
        equivalence={"passed": True, "max_abs_logit_diff": 0.0})


SFT_DATA = {"stage": "sft", "format": "messages", "max_length": 512, "truncation": "error",
            "loss_on": "completion", "tokenizer": "sha256:" + "7" * 64, "chat_template": "sha256:" + "5" * 64,
            "train": {"path": "/data/chats.parquet", "kind": "parquet", "files": 1, "rows": 950,
                      "digest": "sha256:" + "a1" * 32, "keys": {"messages": "conversation"}},
            "eval": {"from": "train", "fraction": 0.05, "seed": 1234, "rows": 50}}
"""An SFT data plan (stages.data.prepare) for the records' dataset section."""


def build_four_stage(store: LineageStore, root: Path, mlf) -> dict:
    pipeline = store.record_pipeline_run("baton", CONFIG, "c0ffee" * 4, 1234, "test-0.1")
    parent = mlf.start_pipeline(pipeline)
    store.set_pipeline_mlflow_run(pipeline.id, parent)
    cpt, cpt_ml, cpt_ck, models = _stage(store, mlf, root, pipeline, parent, "cpt")
    mlf.finish(cpt_ml, "completed")
    store.finish_stage_run(cpt.id, "completed")
    h_sft = _handoff(store, cpt, "sft", cpt_ck, "min_heldout_loss", {}, 30,
                     "lowest held-out loss (1.5)")
    sft, sft_ml, sft_ck, more = _stage(store, mlf, root, pipeline, parent, "sft", h_sft.id)
    models.update(more)
    mlf.log_handoff(sft_ml, store.handoff(h_sft.id), models[h_sft.chosen_checkpoint_id])
    datasets = dataset_records(SFT_DATA, rows_read=480)  # as flows.recording.datasets writes them
    store.set_stage_datasets(sft.id, datasets)
    mlf.log_datasets(sft_ml, datasets)
    store.finish_stage_run(sft.id, "completed")
    mlf.finish(sft_ml, "completed")
    h_rm = _handoff(store, sft, "rm", sft_ck, "max_score", {}, 30, "highest SFT score (0.71)")
    rm, rm_ml, rm_ck, more = _stage(store, mlf, root, pipeline, parent, "rm", h_rm.id)
    models.update(more)
    mlf.log_handoff(rm_ml, store.handoff(h_rm.id), models[h_rm.chosen_checkpoint_id])
    store.finish_stage_run(rm.id, "completed")
    mlf.finish(rm_ml, "completed")
    h_rl = _handoff(store, sft, "rl", sft_ck, "entropy_floor", {"min_entropy": 1.0}, 20,
                    "highest score among checkpoints with entropy >= 1.0; step 30 scored "
                    "higher but its entropy collapsed to 0.42", rejected={30: "entropy 0.42 < 1.0"})
    h_rm_rl = _handoff(store, rm, "rl", rm_ck, "max_pairwise_accuracy", {}, 20,
                       "highest pairwise accuracy (0.78)")
    rl, rl_ml, rl_ck, more = _stage(store, mlf, root, pipeline, parent, "rl", h_rl.id)
    models.update(more)
    store.link_handoff_to_stage_run(h_rm_rl.id, rl.id)
    mlf.log_handoff(rl_ml, store.handoff(h_rl.id), models[h_rl.chosen_checkpoint_id])
    mlf.log_handoff(rl_ml, store.handoff(h_rm_rl.id), models[h_rm_rl.chosen_checkpoint_id],
                    primary=False)
    store.record_event(rl.id, "rollout", "failure", step=7, detail={"error": "env timeout"})
    store.record_event(rl.id, "rollout", "recovery", step=7, detail={"restarted": True})
    store.record_event(rl.id, "trainer", "sync", step=8, detail={"policy_version": 8})
    store.record_journal_segment(rl.id, 0, 10, root / "rl" / "journal" / "seg-0.jsonl",
                                 "sha256:j0", 160)
    store.finish_stage_run(rl.id, "completed")
    mlf.finish(rl_ml, "completed")
    store.finish_pipeline_run(pipeline.id, "completed")
    mlf.log_lineage_graph(parent, store, pipeline.id)
    mlf.finish(parent, "completed")
    return {"pipeline": pipeline.id, "parent_mlflow": parent, "models": models,
            "runs": {"cpt": cpt, "sft": sft, "rm": rm, "rl": rl},
            "mlflow_runs": {"cpt": cpt_ml, "sft": sft_ml, "rm": rm_ml, "rl": rl_ml},
            "checkpoints": {"cpt": cpt_ck, "sft": sft_ck, "rm": rm_ck, "rl": rl_ck},
            "handoffs": {"sft": h_sft, "rm": h_rm, "rl": h_rl, "rm_rl": h_rm_rl}}


class NoMlflow:
    """Stands in for MlflowLineage where a test checks only the store."""

    def __getattr__(self, name):
        return lambda *a, **k: f"{name}-id"
