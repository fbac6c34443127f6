"""`post_training`: CPT -> handoff -> SFT -> handoffs -> RM -> handoffs -> RL.

Reads top to bottom and only wires tasks together; every task takes plain ids,
paths and overrides so it can run on any Prefect worker.
"""
from __future__ import annotations

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from core import mkl_preload

from flows.handoff_task import run_handoff
from flows.stage_task import run_stage


@task(name="open-pipeline-run", cache_policy=NO_CACHE)
def open_pipeline_run(overrides: list[str]) -> dict:
    from flows.recording import Recording
    from flows.stage_config import pipeline_root, stage_config

    cfg = stage_config(overrides, None)
    run = Recording(cfg).start_pipeline(flow_run.get_id())
    root = pipeline_root(cfg, run.id)
    print(f"[baton] pipeline run #{run.id}: stages {cfg.pipeline.stages}; files under {root}", flush=True)
    return {"id": run.id, "root": str(root), "stages": list(cfg.pipeline.stages),
            "handoffs": {name: (h.from_stage, h.to_stage) for name, h in cfg.pipeline.handoffs.items()}}


@task(name="close-pipeline-run", cache_policy=NO_CACHE)
def close_pipeline_run(overrides: list[str], pipeline_run_id: int, status: str) -> None:
    from flows.recording import Recording
    from flows.stage_config import stage_config

    Recording(stage_config(overrides, None)).finish_pipeline(pipeline_run_id, status)


@flow(name="post_training", log_prints=True)
def post_training(overrides: list[str] | None = None) -> dict:
    mkl_preload.load_here()  # before a task imports torch: portable mode's square root (core.mkl_preload)
    overrides = list(overrides or [])
    run = open_pipeline_run(overrides)
    stage_runs: dict[str, dict] = {}
    handoffs: dict[str, int] = {}
    status = "failed"
    try:
        for stage in run["stages"]:
            inputs = {name: run_handoff(overrides, name, run["id"], stage_runs[src]["stage_run_id"],
                                        run["root"])
                      for name, (src, dst) in run["handoffs"].items()
                      if dst == stage and src in stage_runs}
            handoffs.update({name: done["handoff_id"] for name, done in inputs.items()})
            inputs = list(inputs.values())
            stage_runs[stage] = run_stage(overrides, stage, run["id"], run["root"], inputs)
        status = "completed"
    finally:
        close_pipeline_run(overrides, run["id"], status)
    return {"pipeline_run_id": run["id"], "root": run["root"], "stages": stage_runs,
            "handoffs": handoffs}
