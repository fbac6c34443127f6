"""Log a bench to MLflow when a tracking URI is set (`mlflow.tracking_uri=` or
MLFLOW_TRACKING_URI): settings and machine as params, every number as a metric, and the
JSON and PNG as artifacts."""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

EXPERIMENT = "baton-bench"


def tracking_uri(cfg) -> str | None:
    if not cfg.mlflow.enabled:
        return None
    return cfg.mlflow.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or None


def metric_name(*parts: str) -> str:
    """MLflow allows letters, digits and _-. /; method names have parentheses and +."""
    return re.sub(r"[^A-Za-z0-9_.\- /]+", "_", ".".join(parts)).strip("_")


def metrics(result: dict) -> dict[str, float]:
    found: dict[str, float] = {}
    for row in result["bounds"].get("rows", []) + result["methods"]:
        for key, value in row.items():
            if isinstance(value, (int, float)) and key != "rounds":
                found[metric_name(row["name"], key)] = float(value)
    for section in ("load",):
        for key, value in (result.get(section) or {}).items():
            if isinstance(value, (int, float)):
                found[metric_name(section, key)] = float(value)
    for model, run in result["every_step"].items():
        for key, value in run.items():
            if isinstance(value, (int, float)):
                found[metric_name("every_step", model, key)] = float(value)
            elif key.endswith("_ci95"):  # an interval: its two ends
                found[metric_name("every_step", model, key + "_low")] = float(value[0])
                found[metric_name("every_step", model, key + "_high")] = float(value[1])
    return found


def log_to_mlflow(uri: str, result: dict, files: list[Path]) -> str:
    """Returns the run id."""
    sizes = ",".join(f"{s:g}" for s in result["settings"]["sizes_gb"])
    return log_run(uri, f"bench ckpt {sizes} GB", result, metrics(result), files)


def log_run(uri: str, name: str, result: dict, numbers: dict[str, float],
            files: list[Path]) -> str:
    """One MLflow run of a bench: `result`'s settings and machine as params, `numbers` as
    metrics, `files` as artifacts. Returns the run id."""
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(EXPERIMENT)
    run = client.create_run(experiment_id, run_name=name)
    run_id, now = run.info.run_id, int(time.time() * 1000)
    params = {**{f"settings.{k}": v for k, v in result["settings"].items()},
              **{f"machine.{k}": v for k, v in result["machine"].items()}}
    client.log_batch(run_id, params=[Param(k, str(v)[:500]) for k, v in params.items()],
                     metrics=[Metric(k, v, now, 0) for k, v in numbers.items()])
    for path in files:
        client.log_artifact(run_id, str(path))
    client.set_terminated(run_id)
    return run_id
