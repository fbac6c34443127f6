"""Log a tier bench to MLflow (the same experiment and tracking URI as `baton bench ckpt`,
bench.mlflow_log): settings and machine as params, every number as a metric, the JSON
and the PNG as artifacts."""
from __future__ import annotations

from pathlib import Path

from bench.mlflow_log import log_run, metric_name


def tier_metrics(result: dict) -> dict[str, float]:
    found: dict[str, float] = {}
    for key in ("state_bytes", "checkpoint_bytes", "save_s"):
        found[key] = float(result[key])
    for row in result["tiers"]:
        for key, value in row.items():
            if isinstance(value, (int, float)) and key != "rounds":
                found[metric_name(row["tier"], key)] = float(value)
        resident = row["page_cache"]["resident_at_restore_max"]
        if resident is not None:
            found[metric_name(row["tier"], "resident_at_restore_max")] = float(resident)
    for key, value in result["ratios"].items():
        found[metric_name("ratios", key)] = float(value)
    return found


def log_tiers_to_mlflow(uri: str, result: dict, files: list[Path]) -> str:
    """Returns the run id."""
    name = f"bench ckpt --tiers {result['settings']['size_gb']:g} GB"
    return log_run(uri, name, result, tier_metrics(result), files)
