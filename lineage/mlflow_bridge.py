"""MLflow view of the lineage: one parent run per pipeline run, one nested child run per
stage run, each checkpoint an external logged model (files stay where they are) that
is an output of its stage run and an input of the run it was handed to.

Every call names its run explicitly through `MlflowClient`: the pipeline runs inside
Prefect tasks, where MLflow's global "active run" would leak between tasks.
"""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Optional

from lineage import mlflow_study
from lineage import records as r

EXPERIMENT = "baton"
STATUS = {"completed": "FINISHED", "failed": "FAILED", "preempted": "KILLED",
          "running": "RUNNING"}
HANDOFF_TAGS = ("id", "criterion", "chosen_step", "entropy", "from_stage", "input_content_digest")


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    return flat


def handoff_markdown(handoff: r.Handoff) -> str:
    """What was chosen at a handoff and why, for the run's description."""
    entropy = "n/a" if handoff.entropy is None else f"{handoff.entropy:.4f}"
    lines = [
        f"### Handoff {handoff.id}: {handoff.from_stage} → {handoff.to_stage}",
        "",
        f"Chose checkpoint {handoff.chosen_checkpoint_id} at step **{handoff.chosen_step}** by "
        f"criterion `{handoff.criterion}` {json.dumps(handoff.criterion_params)}; "
        f"policy entropy {entropy}.",
        "",
        f"**Why:** {handoff.reason}",
        "",
        "| rank | step | eligible | metrics | rejected because |",
        "|---|---|---|---|---|",
    ]
    for c in handoff.candidates:
        mark = " ✔" if c.chosen else ""
        metrics = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                            for k, v in sorted(c.metrics.items()))
        lines.append(f"| {c.rank if c.rank is not None else '-'}{mark} | {c.step} | "
                     f"{'yes' if c.eligible else 'no'} | {metrics} | {c.rejection_reason or ''} |")
    if handoff.carry_policy:
        lines += ["", f"**Carry policy:** `{json.dumps(handoff.carry_policy, sort_keys=True)}`"]
    return "\n".join(lines) + "\n"


def candidates_table(handoff: r.Handoff) -> dict[str, list]:
    """Column-wise candidates table with one column per metric any candidate has."""
    metric_names = sorted({k for c in handoff.candidates for k in c.metrics})
    table: dict[str, list] = {k: [] for k in (
        "checkpoint_id", "step", "rank", "chosen", "eligible", "rejection_reason", "path")}
    table.update({f"metric.{k}": [] for k in metric_names})
    for c in handoff.candidates:
        for key in ("checkpoint_id", "step", "rank", "chosen", "eligible", "path"):
            table[key].append(getattr(c, key))
        table["rejection_reason"].append(c.rejection_reason or "")
        for k in metric_names:
            table[f"metric.{k}"].append(c.metrics.get(k))
    return table


class MlflowLineage:
    """Mirror of the lineage store in an MLflow tracking store."""

    def __init__(self, tracking_uri: str, artifact_root: str, experiment: str = EXPERIMENT):
        self.tracking_uri = tracking_uri
        self.artifact_root = str(Path(artifact_root).resolve())
        self.experiment = experiment
        self._client = None
        self._experiment_id: Optional[str] = None

    @property
    def client(self):
        if self._client is None:
            from mlflow import MlflowClient
            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    def experiment_id(self) -> str:
        if self._experiment_id is None:
            found = self.client.get_experiment_by_name(self.experiment)
            if found is not None:
                self._experiment_id = found.experiment_id
            else:
                Path(self.artifact_root).mkdir(parents=True, exist_ok=True)
                # The kind tag makes MLflow's UI open the experiment on its training-runs
                # view rather than the GenAI traces overview.
                self._experiment_id = self.client.create_experiment(
                    self.experiment, artifact_location=Path(self.artifact_root).as_uri(),
                    tags={"mlflow.experimentKind": "custom_model_development"})
        return self._experiment_id

    def start_pipeline(self, pipeline: r.PipelineRun) -> str:
        from mlflow.entities import Param
        run = self.client.create_run(
            self.experiment_id(), run_name=f"{pipeline.name} #{pipeline.id}",
            tags={"baton.kind": "pipeline", "baton.pipeline_run.id": str(pipeline.id),
                  "baton.config_hash": pipeline.config_hash, "baton.seed": str(pipeline.seed),
                  "baton.code_version": pipeline.code_version,
                  "baton.prefect_flow_run_id": pipeline.prefect_flow_run_id or ""})
        run_id = run.info.run_id
        self.client.log_dict(run_id, pipeline.config, "config/resolved.json")
        params = [Param(k[:250], v[:6000]) for k, v in _flatten(pipeline.config).items()]
        for start in range(0, len(params), 100):  # MLflow's batch limit
            self.client.log_batch(run_id, params=params[start:start + 100])
        return run_id

    def start_stage(self, parent_run_id: str, stage_run: r.StageRun) -> str:
        run = self.client.create_run(
            self.experiment_id(), run_name=f"{stage_run.stage} attempt {stage_run.attempt}",
            tags={"mlflow.parentRunId": parent_run_id, "baton.kind": "stage",
                  "baton.stage": stage_run.stage, "baton.attempt": str(stage_run.attempt),
                  "baton.stage_run.id": str(stage_run.id),
                  "baton.pipeline_run.id": str(stage_run.pipeline_run_id)})
        from mlflow.entities import Param
        params = [Param(f"parallel.{k}", str(v)) for k, v in stage_run.parallel_config.items()]
        if params:
            self.client.log_batch(run.info.run_id, params=params)
        return run.info.run_id

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        if batch:
            self.client.log_batch(run_id, metrics=batch)

    def log_checkpoint(self, stage_run_mlflow_id: str, checkpoint: r.Checkpoint,
                       manifest_path: Optional[str | Path] = None) -> str:
        """Register a committed checkpoint as an external logged model; return its id."""
        from mlflow.entities import LoggedModelOutput, LoggedModelStatus, Metric
        from mlflow.utils.mlflow_tags import MLFLOW_MODEL_IS_EXTERNAL
        client = self.client
        model = client.create_logged_model(
            experiment_id=self.experiment_id(),
            name=f"{checkpoint.stage}-step-{checkpoint.step:06d}",
            source_run_id=stage_run_mlflow_id, model_type="baton-checkpoint",
            tags={MLFLOW_MODEL_IS_EXTERNAL: "true", "baton.checkpoint.id": str(checkpoint.id),
                  "baton.checkpoint.path": checkpoint.path, "baton.stage": checkpoint.stage,
                  "baton.checkpoint.format": checkpoint.format,
                  "baton.checkpoint.content_digest": checkpoint.content_digest or "",
                  **_location_tags(checkpoint.locations)},
            params={"step": str(checkpoint.step), "tokens_seen": str(checkpoint.tokens_seen),
                    "bytes": str(checkpoint.bytes), "format": checkpoint.format,
                    "manifest_checksum": checkpoint.manifest_checksum,
                    "content_digest": checkpoint.content_digest or "",
                    **{f"parallel.{k}": str(v) for k, v in checkpoint.parallel_config.items()}})
        self._log_model_files(model, checkpoint, manifest_path)
        client.finalize_logged_model(model.model_id, LoggedModelStatus.READY)
        client.log_outputs(stage_run_mlflow_id,
                           [LoggedModelOutput(model.model_id, checkpoint.step)])
        now = int(time.time() * 1000)
        numeric = {k: float(v) for k, v in checkpoint.metrics.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if numeric:
            client.log_batch(stage_run_mlflow_id, metrics=[
                Metric(k, v, now, checkpoint.step, model_id=model.model_id)
                for k, v in numeric.items()])
        return model.model_id

    def log_environment(self, run_id: str, fingerprint: dict) -> None:
        """The stage's environment fingerprint: `environment.json`, and as `env.*` params the
        facts a reader filters runs by (repro mode, CPU capability and model, versions)."""
        self.client.log_dict(run_id, fingerprint, "environment.json")
        versions = fingerprint.get("versions", {})
        params = {"env.repro_mode": fingerprint.get("repro_mode"),
                  "env.cpu_capability": fingerprint.get("cpu_capability"),
                  "env.cpu_model": (fingerprint.get("cpu") or {}).get("model"),
                  "env.threads": (fingerprint.get("threads") or {}).get("intra_op"),
                  "env.code": fingerprint.get("code"), "env.config_hash": fingerprint.get("config_hash"),
                  **{f"env.{name}": v for name, v in versions.items()}}
        from mlflow.entities import Param
        self.client.log_batch(run_id, params=[Param(k, str(v)[:500]) for k, v in params.items()])

    def log_datasets(self, run_id: str, datasets: list[dict]) -> None:
        """Each dataset the stage read (stages.data.lineage) as a dataset input of its run,
        tagged with its context (train or eval): the runs table's Dataset column and the
        run page show which data trained which run. The digest is baton's content digest;
        the profile says rows, rows read and how the rows were tokenized."""
        from mlflow.entities import Dataset, DatasetInput, InputTag
        from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

        inputs = []
        for d in datasets:
            profile = {k: d.get(k) for k in ("rows", "rows_read", "format", "keys", "max_length",
                                             "truncation", "loss_on", "tokenizer", "chat_template",
                                             "allowed_change")}
            dataset = Dataset(name=f"{d['stage']}-{d['role']}: {Path(str(d['path'])).name}",
                              digest=str(d["digest"]).split(":", 1)[-1][:36], source_type="local",
                              source=json.dumps({"uri": str(d["path"])}),
                              profile=json.dumps(profile, default=str))
            context = "training" if d["role"] == "train" else d["role"]
            inputs.append(DatasetInput(dataset, tags=[InputTag(MLFLOW_DATASET_CONTEXT, context),
                                                      InputTag("baton.digest", str(d["digest"]))]))
        self.client.log_inputs(run_id, datasets=inputs)

    def log_rl_journal(self, run_id: str, segments: list[dict], events: list[dict]) -> None:
        """The RL journal's index and every role event (weight syncs, failures, retries,
        restarts; `segment` = the journal step it is in) as `rl/journal.json`, plus counts
        of failures, retries, restarts, environment failures, dropped groups and
        environment alerts per journal step."""
        from mlflow.entities import Metric
        self.client.log_dict(run_id, {"segments": segments, "events": events}, "rl/journal.json")
        now, metrics = int(time.time() * 1000), []
        for segment in segments:
            for kind in ("role_failure", "retry", "trainer_restart", "env_failure", "drop", "env_alert"):
                count = sum(1 for e in events if e["segment"] == segment["step"] and e["kind"] == kind)
                metrics.append(Metric(f"rl_{kind}s", float(count), now, segment["step"]))
        for i in range(0, len(metrics), 900):  # MLflow takes at most 1000 metrics per batch
            self.client.log_batch(run_id, metrics=metrics[i:i + 900])
        self._log_staleness(run_id, segments)

    def _log_staleness(self, run_id: str, segments: list[dict]) -> None:
        """rl.max_staleness runs: the staleness histogram (samples per number of policy
        versions behind the trainer), per step and in total, as JSON and a bar chart."""
        total: dict[int, int] = {}
        for segment in segments:
            for key, count in (segment.get("staleness") or {}).items():
                total[int(key)] = total.get(int(key), 0) + count
        if not any(key > 0 for key in total):
            return  # on-policy: nothing to show
        self.client.log_dict(run_id, {"total": {str(k): total[k] for k in sorted(total)},
                                      "per_step": {str(s["step"]): s.get("staleness") for s in segments}},
                             "rl/staleness.json")
        import tempfile

        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(4.5, 3))
        keys = sorted(total)
        ax.bar([str(k) for k in keys], [total[k] for k in keys])
        ax.set_xlabel("staleness (policy versions behind the trainer)")
        ax.set_ylabel("samples")
        fig.tight_layout()
        with tempfile.TemporaryDirectory() as scratch:
            path = f"{scratch}/staleness.png"
            fig.savefig(path, dpi=110)
            self.client.log_artifact(run_id, path, "rl")
        plt.close(fig)

    def _log_model_files(self, model, checkpoint: r.Checkpoint, manifest_path) -> None:
        # Only small metadata travels: the MLmodel stub that marks the model external,
        # the manifest and the lineage record. The weights stay at checkpoint.path.
        from mlflow.models.model import MLMODEL_FILE_NAME
        from mlflow.models.utils import get_external_mlflow_model_spec
        with tempfile.TemporaryDirectory() as tmp:
            get_external_mlflow_model_spec(model).save(str(Path(tmp) / MLMODEL_FILE_NAME))
            (Path(tmp) / "baton_checkpoint.json").write_text(
                json.dumps(r.to_jsonable(checkpoint), indent=2, sort_keys=True))
            if manifest_path is not None and Path(manifest_path).is_file():
                (Path(tmp) / "manifest.json").write_bytes(Path(manifest_path).read_bytes())
            self.client.log_model_artifacts(model.model_id, tmp)

    def log_handoff(self, downstream_run_id: str, handoff: r.Handoff,
                    chosen_model_id: Optional[str], *, primary: bool = True) -> None:
        """Tags, candidates table, description and model input of one handoff.

        The primary handoff (the policy's) owns the `baton.handoff.*` tags; others into
        the same run (RM -> RL) use `baton.handoff.<from_stage>.*`.
        """
        from mlflow.entities import LoggedModelInput
        prefix = "baton.handoff." if primary else f"baton.handoff.{handoff.from_stage}."
        values = {"id": handoff.id, "criterion": handoff.criterion,
                  "chosen_step": handoff.chosen_step,
                  "entropy": "n/a" if handoff.entropy is None else f"{handoff.entropy:.4f}",
                  "from_stage": handoff.from_stage,
                  # Identity by content (ckpt.content_digest) of what the stage started from.
                  "input_content_digest": (handoff.reshard or {}).get("output_content_digest", "")}
        for key in HANDOFF_TAGS:
            self.client.set_tag(downstream_run_id, prefix + key, str(values[key]))
        base = f"handoff/{handoff.id}-{handoff.from_stage}-to-{handoff.to_stage}"
        self.client.log_table(downstream_run_id, candidates_table(handoff), f"{base}-candidates.json")
        self.client.log_dict(downstream_run_id, r.to_jsonable(handoff), f"{base}.json")
        note = handoff_markdown(handoff)
        self.client.log_text(downstream_run_id, note, f"{base}.md")
        existing = self.client.get_run(downstream_run_id).data.tags.get("mlflow.note.content")
        # Several handoffs can feed one run (SFT and RM into RL): keep every note.
        if existing and f"### Handoff {handoff.id}:" not in existing:
            note = f"{existing}\n{note}"
        self.client.set_tag(downstream_run_id, "mlflow.note.content", note)
        if chosen_model_id:
            self.client.log_inputs(downstream_run_id, models=[LoggedModelInput(chosen_model_id)])

    def log_lineage_graph(self, parent_run_id: str, store, pipeline_id: int) -> None:
        from lineage.graph import lineage_figure, pipeline_view
        figure = lineage_figure(pipeline_view(store, pipeline_id))
        self.client.log_figure(parent_run_id, figure, "lineage/lineage.png")

    def log_study(self, study: r.Study, artifacts: list[Path]) -> tuple[str, dict[int, str]]:
        """A study as a parent run with one child run per candidate (lineage.mlflow_study);
        returns the parent run id and {checkpoint_id: child run id}."""
        return mlflow_study.log_study(self.client, self.experiment_id(), study, artifacts,
                                      _flatten(study.config))

    def finish(self, run_id: str, status: str) -> None:
        self.client.set_terminated(run_id, STATUS.get(status, "FAILED"))

    def model_id_for_checkpoint(self, checkpoint_id: int) -> Optional[str]:
        """The logged model `log_checkpoint` made for a lineage checkpoint (tasks of one
        pipeline may run in different processes, so it is looked up, not remembered)."""
        found = self.client.search_logged_models(
            experiment_ids=[self.experiment_id()],
            filter_string=f"tags.`baton.checkpoint.id` = '{int(checkpoint_id)}'", max_results=1)
        return found[0].model_id if found else None


class NullMlflowLineage:
    """`mlflow.enabled=false`: every call is accepted and nothing is logged."""

    def start_pipeline(self, pipeline) -> str:
        return ""

    def start_stage(self, parent_run_id, stage_run) -> str:
        return ""

    def log_metrics(self, run_id, metrics, step) -> None:
        pass

    def log_checkpoint(self, stage_run_mlflow_id, checkpoint, manifest_path=None) -> str:
        return ""

    def log_handoff(self, downstream_run_id, handoff, chosen_model_id, *, primary=True) -> None:
        pass

    def log_environment(self, run_id, fingerprint) -> None:
        pass

    def log_rl_journal(self, run_id, segments, events) -> None:
        pass

    def log_datasets(self, run_id, datasets) -> None:
        pass

    def log_lineage_graph(self, parent_run_id, store, pipeline_id) -> None:
        pass

    def log_study(self, study, artifacts) -> tuple[str, dict]:
        return "", {}

    def finish(self, run_id, status) -> None:
        pass

    def model_id_for_checkpoint(self, checkpoint_id) -> None:
        return None


def _location_tags(locations: Optional[dict]) -> dict[str, str]:
    """`baton.tier.<tier>`: where that tier's copy is, or why there is none (ckpt.tiers)."""
    return {f"baton.tier.{tier}": (str(o.get("where", "")) if o.get("ok")
                                   else f"failed: {o.get('error', '')}")[:5000]
            for tier, o in (locations or {}).items()}


def mlflow_lineage(cfg) -> MlflowLineage | NullMlflowLineage:
    """The MLflow view configured by `mlflow.*`: real, or a null object when disabled."""
    from lineage.urls import artifact_root, mlflow_uri
    if not cfg.mlflow.enabled:
        return NullMlflowLineage()
    return MlflowLineage(mlflow_uri(cfg), artifact_root(cfg), experiment=cfg.run.name)
