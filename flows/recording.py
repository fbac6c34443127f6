"""Lineage + MLflow writes the flow makes, in one place (the flow itself holds no SQL).

Every task opens its own `Recording` from the composed config, so tasks can run in
other processes (Prefect workers) with nothing but ids and paths passed between them.
"""
from __future__ import annotations

import json
from pathlib import Path

from core.config.compose import as_dict, config_hash
from core.fingerprint import code_version
from ckpt import manifest as manifest_io
from ckpt.content_digest import content_digest
from ckpt.layout import stage_dir
from ckpt.reader import CheckpointReader
from ckpt.reproduce import read_trace
from stages.run_files import ENVIRONMENT, METRICS


class Recording:
    def __init__(self, cfg):
        from lineage import LineageStore, mlflow_lineage, store_url

        self.cfg = cfg
        self.store = LineageStore.open(store_url(cfg))
        self.mlflow = mlflow_lineage(cfg)

    # -- pipeline ---------------------------------------------------------------------
    def start_pipeline(self, flow_run_id: str | None):
        cfg = self.cfg
        run = self.store.record_pipeline_run(cfg.run.name, as_dict(cfg), config_hash(cfg), cfg.seed,
                                             code_version(), prefect_flow_run_id=flow_run_id)
        mlflow_id = self.mlflow.start_pipeline(run)
        if mlflow_id:
            run = self.store.set_pipeline_mlflow_run(run.id, mlflow_id)
        return run

    def finish_pipeline(self, pipeline_run_id: int, status: str) -> None:
        run = self.store.finish_pipeline_run(pipeline_run_id, status)
        if run.mlflow_run_id:
            self.mlflow.log_lineage_graph(run.mlflow_run_id, self.store, pipeline_run_id)
            self.mlflow.finish(run.mlflow_run_id, status)

    # -- stages -----------------------------------------------------------------------
    def start_stage(self, pipeline_run_id: int, stage: str, parallel: dict, handoff_id=None):
        run = self.store.record_stage_run(pipeline_run_id, stage, parallel, handoff_id=handoff_id)
        parent = self.store.pipeline_run(pipeline_run_id).mlflow_run_id
        if parent:
            mlflow_id = self.mlflow.start_stage(parent, run)
            if mlflow_id:
                run = self.store.set_stage_mlflow_run(run.id, mlflow_id)
        return run

    def stage_outputs(self, stage_run, run_dir: Path, checkpoints: list[dict]) -> list:
        """Per-step metrics to MLflow; the environment fingerprint and every committed
        checkpoint to lineage and MLflow."""
        self.environment(stage_run, stage_dir(run_dir, stage_run.stage) / ENVIRONMENT)
        metrics_file = stage_dir(run_dir, stage_run.stage) / METRICS
        trace = read_trace(metrics_file) if metrics_file.is_file() else {}
        if stage_run.mlflow_run_id:
            for record in trace.values():
                numbers = {k: v for k, v in record.items() if k != "step" and isinstance(v, (int, float))}
                self.mlflow.log_metrics(stage_run.mlflow_run_id, numbers, record["step"])
        recorded = []
        for saved in checkpoints:
            path = Path(saved["path"])
            if not (path / manifest_io.MANIFEST).is_file():
                continue  # removed by retention since
            manifest = manifest_io.verify(path, checksums=False)
            progress = CheckpointReader(path, manifest).json("progress.json")  # checked bytes
            ckpt = self.store.record_checkpoint(
                stage_run.id, manifest.step, str(path), manifest_io.checksum_of(path / manifest_io.MANIFEST),
                manifest.total_bytes(), "deepspeed", manifest.parallel,
                tokens_seen=progress["tokens_seen"], metrics=trace.get(manifest.step, {}),
                content_digest=content_digest(manifest), locations=saved.get("placement"))
            if stage_run.mlflow_run_id:
                self.mlflow.log_checkpoint(stage_run.mlflow_run_id, ckpt, path / manifest_io.MANIFEST)
            recorded.append(ckpt)
        if stage_run.stage == "rl":
            self.rl_journal(stage_run, run_dir)
        return recorded

    def datasets(self, stage_run, plan: dict | None, rows_read: int) -> None:
        """The datasets the stage read (stages.data), to lineage and as MLflow inputs."""
        if plan is None:
            return
        from stages.data.lineage import dataset_records
        records = dataset_records(plan, rows_read)
        self.store.set_stage_datasets(stage_run.id, records)
        if stage_run.mlflow_run_id:
            self.mlflow.log_datasets(stage_run.mlflow_run_id, records)

    def environment(self, stage_run, path: Path) -> None:
        """The fingerprint the workers wrote (absent when they never started)."""
        if not path.is_file():
            return
        fingerprint = json.loads(path.read_text())
        self.store.set_stage_environment(stage_run.id, fingerprint)
        if stage_run.mlflow_run_id:
            self.mlflow.log_environment(stage_run.mlflow_run_id, fingerprint)

    def rl_journal(self, stage_run, run_dir: Path) -> None:
        """Index every committed journal segment (checked against its manifest) and record
        each role event in lineage and MLflow."""
        from ckpt import journal
        from stages.rl.steps import journal_root

        root = journal_root(run_dir)
        segments, events = [], []
        for step in journal.committed_steps(root):
            records, _ = journal.read_segment(root, step)
            seg = journal.segment_dir(root, step)
            checksum = manifest_io.checksum_of(seg / journal.MANIFEST)
            self.store.record_journal_segment(stage_run.id, step, step, str(seg), checksum,
                                              len(records["samples"]))
            segments.append({"step": step, "path": str(seg), "manifest_sha256": checksum,
                             "samples": len(records["samples"]), "staleness": records.get("staleness")})
            for event in records["events"]:
                role = event.get("role") or ("rollout" if event["kind"] == "weight_sync" else "trainer")
                self.store.record_event(stage_run.id, role, event["kind"], step=step, detail=event)
                events.append({**event, "segment": step})  # event["step"] is 0-based
        if stage_run.mlflow_run_id and segments:
            self.mlflow.log_rl_journal(stage_run.mlflow_run_id, segments, events)

    def finish_stage(self, stage_run_id: int, status: str) -> None:
        run = self.store.finish_stage_run(stage_run_id, status)
        if run.mlflow_run_id:
            self.mlflow.finish(run.mlflow_run_id, status)

    # -- handoffs ---------------------------------------------------------------------
    def log_handoff(self, handoff_id: int, downstream_stage_run, primary: bool) -> None:
        handoff = self.store.handoff(handoff_id)
        if not downstream_stage_run.mlflow_run_id:
            return
        chosen_model = self.mlflow.model_id_for_checkpoint(handoff.chosen_checkpoint_id)
        self.mlflow.log_handoff(downstream_stage_run.mlflow_run_id, handoff, chosen_model,
                                primary=primary)

