"""Log a selective bench to MLflow (the same experiment and tracking URI as `baton bench
ckpt`, bench.mlflow_log): settings and machine as params, every number as a metric, the
JSON and the PNG as artifacts."""
from __future__ import annotations

from pathlib import Path

from bench.mlflow_log import log_run, metric_name

SUMMARY = ("deviation_max", "deviation_mean", "mean_loss_deviation", "deviation_max_to_end",
           "stage_s")


def selective_metrics(result: dict) -> dict[str, float]:
    found: dict[str, float] = {"bytes_ratio": float(result["bytes_ratio"]),
                               "uninterrupted_deviation_max":
                                   float(result["uninterrupted_deviation_max"]),
                               "restart.step": float(result["restart"]["step"])}
    for run in ("full", "selective"):
        for key in ("total_bytes", "composite_saves", "stage_s"):
            found[metric_name(run, key)] = float(result[run][key])
        for step, nbytes in zip(result[run]["steps"], result[run]["bytes_per_save"]):
            found[metric_name(run, "bytes", f"step_{step:06d}")] = float(nbytes)
    for section in ("restart", "control"):
        for key in SUMMARY:
            found[metric_name(section, key)] = float(result[section][key])
        for step, value in zip(result[section]["steps"], result[section]["per_step"]):
            found[metric_name(section, "deviation", f"step_{step:06d}")] = float(value)
    return found


def log_selective_to_mlflow(uri: str, result: dict, files: list[Path]) -> str:
    """Returns the run id."""
    s = result["settings"]
    name = f"bench ckpt --selective threshold {s['threshold']:g} full_every {s['full_every']}"
    return log_run(uri, name, result, selective_metrics(result), files)
