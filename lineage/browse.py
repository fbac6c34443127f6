"""What `baton lineage` shows, gathered from the store: the choices behind a view.

Which pipeline run "no id" means, whether a checkpoint argument is an id or a path,
and which records make up a run's tree are lineage decisions; the command only
parses its arguments and prints what these return.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from lineage import records as r
from lineage.errors import UnknownRecord


@dataclass(frozen=True)
class PipelineView:
    """One pipeline run with its stage runs, their checkpoints and its handoffs."""
    pipeline: r.PipelineRun
    runs: list
    checkpoints: dict  # stage run id -> list of checkpoints
    handoffs: list


def pipeline_or_latest(store, pipeline_id: Optional[int]) -> r.PipelineRun:
    """The named pipeline run, or the latest one when none is named; an empty store is
    an error that says how to fill it."""
    if pipeline_id is not None:
        return store.pipeline_run(pipeline_id)
    pipeline = store.latest_pipeline_run()
    if pipeline is None:
        raise UnknownRecord("pipeline run", "latest", store.url,
                            "the store is empty: run `baton run` first")
    return pipeline


def pipeline_view(store, pipeline_id: Optional[int]) -> PipelineView:
    pipeline = pipeline_or_latest(store, pipeline_id)
    runs = store.stage_runs(pipeline.id)
    checkpoints = {run.id: store.checkpoints(run.id) for run in runs}
    return PipelineView(pipeline, runs, checkpoints, store.handoffs(pipeline.id))


def find_checkpoint(store, key: str) -> r.Checkpoint:
    """A checkpoint named by its id (all digits) or by its directory."""
    return store.checkpoint(int(key)) if key.isdigit() else store.checkpoint_by_path(key)
