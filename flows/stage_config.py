"""The config of one stage inside a pipeline run.

A pipeline run keeps its stages under its own directory (`<run.dir>/pipeline-NNNN/`,
so two runs never overwrite each other's checkpoints) while lineage and MLflow stay
at the run home shared by all runs.
"""
from __future__ import annotations

from pathlib import Path

from core.config import compose
from core.config.compose import quoted
from core.config.schema import BatonConfig


def pipeline_root(cfg: BatonConfig, pipeline_run_id: int) -> Path:
    return Path(cfg.run.dir) / f"pipeline-{pipeline_run_id:04d}"


def stage_config(overrides: list[str], stage: str | None, stage_root: str | None = None,
                 extra: list[str] | None = None) -> BatonConfig:
    if stage is None:
        return compose(overrides)
    return compose(stage_overrides(overrides, stage, stage_root, extra))


def stage_overrides(overrides: list[str], stage: str, stage_root: str | None = None,
                    extra: list[str] | None = None) -> list[str]:
    """The overrides that compose `stage`'s config (also for a process of its own)."""
    from lineage.urls import mlflow_uri, store_url

    top = compose(overrides)

    layout = top.pipeline.parallel.get(stage)
    group = [f"stage={stage}"] + ([f"parallel={layout}"] if layout else [])
    pinned = [quoted("store.url", store_url(top)), quoted("mlflow.tracking_uri", mlflow_uri(top))]
    if stage_root is not None:
        pinned.append(quoted("run.dir", stage_root))
    return [*group, *overrides, *top.pipeline.overrides.get(stage, []), *pinned, *(extra or [])]
