"""MLflow view of a study: one parent run `study-<kind>-<id>` with the correlation
metrics, the verdict and the plots, and one child run per candidate checkpoint with
its diagnostics and RL outcome, so that MLflow's compare view plots one against the
other. `MlflowLineage.log_study` calls `log_study` here with its client.
"""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

from lineage import records as r
from lineage.errors import InvalidValue

CORRELATION_STATS = ("spearman", "spearman_lo", "spearman_hi", "kendall", "kendall_lo",
                     "kendall_hi")
# Run status of the parent for the study's status; a study logged while still
# running has logged everything it has, so its run is finished too.
STATUS = {"completed": "FINISHED", "running": "FINISHED", "failed": "FAILED"}
# MLflow accepts letters, digits, `_ - . / :` and spaces in names (no `:` on Windows);
# `/` and spaces are left out too, so that no name reads as a path.
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")
MAX_KEY = 250  # MLflow's limit on metric and param names
MAX_PARAM_VALUE, MAX_TAG_VALUE = 6000, 8000
METRICS_PER_BATCH, PARAMS_PER_BATCH = 1000, 100


def mlflow_key(*parts: Any) -> str:
    """`parts` joined by `.` as a name MLflow accepts: `pass@1` becomes `pass_at_1`."""
    return ".".join(_UNSAFE.sub("_", str(p).replace("@", "_at_")) for p in parts)[:MAX_KEY]


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def correlation_metrics(results: Optional[Mapping[str, Any]]) -> dict[str, float]:
    """`spearman.<target>.<diagnostic>` (and `_lo`/`_hi`, `kendall…`) for every row of
    `results["correlations"]`; undefined correlations (None) are left out."""
    metrics: dict[str, float] = {}
    for row in (results or {}).get("correlations", []):
        for stat in CORRELATION_STATS:
            value = _number(row.get(stat))
            if value is not None:
                metrics[mlflow_key(stat, row["target"], row["diagnostic"])] = value
    return metrics


def candidate_metrics(candidate: r.StudyCandidate) -> dict[str, float]:
    """The candidate's numeric diagnostics and RL outcome, under their own names."""
    values = {**candidate.diagnostics, **(candidate.outcome or {})}
    return {mlflow_key(k): v for k, v in ((k, _number(v)) for k, v in values.items())
            if v is not None}


def _log(client, run_id: str, params: Mapping[str, Any], metrics: Mapping[str, float]) -> None:
    from mlflow.entities import Metric, Param
    now = int(time.time() * 1000)
    batch_params = [Param(mlflow_key(k), str(v)[:MAX_PARAM_VALUE]) for k, v in params.items()]
    batch_metrics = [Metric(k, v, now, 0) for k, v in metrics.items()]
    for i in range(0, len(batch_params), PARAMS_PER_BATCH):
        client.log_batch(run_id, params=batch_params[i:i + PARAMS_PER_BATCH])
    for i in range(0, len(batch_metrics), METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=batch_metrics[i:i + METRICS_PER_BATCH])


def _check_artifacts(artifacts: Iterable[Path]) -> list[Path]:
    """Checked before any run is made, so that a missing plot leaves no half-logged study."""
    paths = [Path(a) for a in artifacts]
    for path in paths:
        if not path.exists():
            raise InvalidValue("artifacts", str(path), "files or directories that exist")
    return paths


def _log_candidate(client, experiment_id: str, parent_id: str, study: r.Study,
                   candidate: r.StudyCandidate) -> str:
    run = client.create_run(
        experiment_id, run_name=f"candidate-step-{candidate.step}",
        tags={"mlflow.parentRunId": parent_id, "baton.kind": "study_candidate",
              "baton.study_id": str(study.id), "baton.checkpoint.id": str(candidate.checkpoint_id),
              "baton.from_stage_run_id": str(study.from_stage_run_id)})
    run_id = run.info.run_id
    params = {"step": candidate.step, "checkpoint_id": candidate.checkpoint_id}
    if candidate.rl_run_dir:
        params["rl_run_dir"] = candidate.rl_run_dir
    _log(client, run_id, params, candidate_metrics(candidate))
    client.set_terminated(run_id, "FINISHED")
    return run_id


def log_study(client, experiment_id: str, study: r.Study, artifacts: Iterable[Path],
              config_params: Mapping[str, str]) -> tuple[str, dict[int, str]]:
    """Log `study` (params K, kind, `config.*` from `config_params`) and return the parent
    run id and {checkpoint_id: child run id}."""
    paths = _check_artifacts(artifacts)
    tags = {"baton.kind": "study", "baton.study_id": str(study.id),
            "baton.study.kind": study.kind,
            "baton.from_stage_run_id": str(study.from_stage_run_id)}
    if study.winner_diagnostic is not None:
        tags["baton.study.winner"] = f"{study.winner_diagnostic} ({study.winner_direction:+d})"
    if study.verdict:
        # The run's description in the UI; verdict.md keeps the whole of a longer one.
        tags["mlflow.note.content"] = study.verdict[:MAX_TAG_VALUE]
    parent_id = client.create_run(experiment_id, run_name=f"study-{study.kind}-{study.id}",
                                  tags=tags).info.run_id
    params = {"K": len(study.candidates), "kind": study.kind,
              **{f"config.{k}": v for k, v in config_params.items()}}
    _log(client, parent_id, params, correlation_metrics(study.results))
    if study.verdict:
        client.log_text(parent_id, study.verdict, "verdict.md")
    for path in paths:
        if path.is_dir():
            client.log_artifacts(parent_id, str(path), path.name)
        else:
            client.log_artifact(parent_id, str(path))
    children = {c.checkpoint_id: _log_candidate(client, experiment_id, parent_id, study, c)
                for c in study.candidates}
    client.set_terminated(parent_id, STATUS.get(study.status, "FAILED"))
    return parent_id, children
