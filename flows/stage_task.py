"""The stage task: launch a stage's workers from its handoff inputs and record the outcome.

Retries are for infrastructure only (a worker killed by a signal, a rendezvous that
never formed); a Python error in the training code fails the task at once.
"""
from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from ckpt.parallel_layout import Layout
from flows.stage_config import stage_config


def infrastructure_only(task, task_run, state) -> bool:
    from stages.launch import StageFailed

    try:
        state.result()
    except StageFailed as exc:
        return exc.infrastructure
    except Exception:
        return False
    return False


@task(name="stage", retries=1, retry_delay_seconds=5, retry_condition_fn=infrastructure_only,
      cache_policy=NO_CACHE)
def run_stage(overrides: list[str], stage: str, pipeline_run_id: int, root: str,
              inputs: list[dict]) -> dict:
    from core.errors import BatonError
    from core.repro import pin_this_process
    from flows.recording import Recording
    from handoff.carry import inputs_as_overrides
    from stages.launch import launch_stage
    from stages.model import ensure_model_dir

    policy, extra = inputs_as_overrides(inputs)
    cfg = stage_config(overrides, stage, root, extra)
    pin_this_process(cfg.repro)  # the built-in model is created (randomly initialised) here
    rec = Recording(cfg)
    parallel = Layout.from_config(cfg).sharding.to_dict()
    stage_run = rec.start_stage(pipeline_run_id, stage, parallel,
                                handoff_id=policy["handoff_id"] if policy else None)
    for item in inputs:
        if item is not policy:
            rec.store.link_handoff_to_stage_run(item["handoff_id"], stage_run.id)
        rec.log_handoff(item["handoff_id"], stage_run, primary=item is policy)
    parent = {"handoffs": [i["handoff_id"] for i in inputs], "stage_run_id": stage_run.id,
              "init_from": cfg.stage.init_from}
    try:
        result = launch_stage(cfg, ensure_model_dir(cfg), parent)
    except BatonError as exc:  # StageFailed, or an input refused before any worker started
        rec.store.record_event(stage_run.id, "trainer", "failure", detail={"error": str(exc)})
        rec.finish_stage(stage_run.id, "failed")
        raise
    recorded = rec.stage_outputs(stage_run, Path(cfg.run.dir), result.checkpoints)
    rec.datasets(stage_run, result.data, result.step * cfg.stage.global_batch)
    rec.finish_stage(stage_run.id, result.status)
    return {"stage_run_id": stage_run.id, "status": result.status, "step": result.step,
            "checkpoints": [c.path for c in recorded]}
