"""`rerun_stage`: re-run the downstream stage of a recorded handoff and compare.

The input is re-materialised from the record (its manifest checksum must match what
the handoff recorded), the stage runs again with the recorded config and seed as a
new attempt linked to the same handoff, and the verdict says whether the per-step
trace and the final checkpoint reproduced bit for bit. Wiring only: what is compared
and the verdict are `handoff.rerun`.
"""
from __future__ import annotations

import json
from dataclasses import asdict

from prefect import flow, task
from prefect.cache_policies import NO_CACHE


@task(name="rerun-stage", cache_policy=NO_CACHE)
def rerun_task(handoff_id: int, overrides: list[str]) -> dict:
    from core.config import compose
    from flows.recording import Recording  # imports torch: after the flow loaded the square root
    from handoff.rerun import RerunNotPossible, plan_rerun, verdict
    from stages.launch import launch_stage

    rec = Recording(compose(overrides))
    handoff = rec.store.handoff(handoff_id)
    if handoff.to_stage_run_id is None:
        raise RerunNotPossible(handoff_id, f"no {handoff.to_stage} stage run started from it")
    original_run = rec.store.stage_run(handoff.to_stage_run_id)
    plan = plan_rerun(handoff, original_run.id,
                      [c.path for c in rec.store.checkpoints(original_run.id)])
    stage_run = rec.start_stage(original_run.pipeline_run_id, handoff.to_stage,
                                original_run.parallel_config, handoff_id=handoff_id)
    rec.log_handoff(handoff_id, stage_run, primary=True)
    print(f"[rerun] handoff {handoff_id}: {handoff.to_stage} attempt {stage_run.attempt} in "
          f"{plan.attempt_dir}", flush=True)
    result = launch_stage(plan.cfg, plan.model_dir, {"rerun_of_stage_run": original_run.id,
                                                     "handoffs": [handoff_id]})
    rec.stage_outputs(stage_run, plan.attempt_dir, result.checkpoints)
    rec.datasets(stage_run, result.data, result.step * plan.cfg.stage.global_batch)
    outcome = verdict(plan, handoff.to_stage, result.checkpoints, original_run.environment, result.data)
    rec.store.record_event(stage_run.id, "trainer", "rerun",
                           detail={"handoff_id": handoff_id, "original_stage_run": original_run.id,
                                   **asdict(outcome)})
    rec.finish_stage(stage_run.id, result.status)
    print(f"[rerun] {outcome.summary()}", flush=True)
    return {"stage_run_id": stage_run.id, "reproduced": outcome.reproduced,
            "summary": outcome.summary(),
            "verdict": json.loads(json.dumps(asdict(outcome), default=str))}


@flow(name="rerun_stage", log_prints=True)
def rerun_stage(handoff_id: int, overrides: list[str] | None = None) -> dict:
    from core import mkl_preload

    mkl_preload.load_here()  # before a task imports torch: portable mode's square root (core.mkl_preload)
    return rerun_task(handoff_id, list(overrides or []))
