"""Lineage of checkpoints that enter or leave baton by hand: `baton ckpt adopt` records an
adopted checkpoint; `baton ckpt export` reads where a checkpoint came from for its card.

An adoption is recorded as a pipeline run named "adopt" with one completed stage run
(the stage the checkpoint stands for), the checkpoint (format "deepspeed" or "hf") and
an "adopted" event holding the origin, so `baton lineage trace <path>` finds it like
any other checkpoint.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping, Optional

from lineage import records as r
from lineage.errors import UnknownRecord

ADOPT_RUN_NAME = "adopt"


def record_adoption(store, *, stage: str, path: str, step: int, kind: str,
                    manifest_checksum: str, size: int, parallel: Mapping[str, Any],
                    origin: Mapping[str, Any], code_version: str) -> r.Checkpoint:
    """One "adopt" pipeline run, its stage run, the checkpoint and the origin event."""
    config = {"adopt": {"source": origin.get("source"), "kind": kind, "stage": stage,
                        "path": path}}
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
    run = store.record_pipeline_run(ADOPT_RUN_NAME, config, digest, 0, code_version)
    stage_run = store.record_stage_run(run.id, stage, dict(parallel))
    checkpoint = store.record_checkpoint(stage_run.id, step, path, manifest_checksum, size, kind,
                                         dict(parallel))
    store.record_event(stage_run.id, "adopt", "adopted", step=step, detail=dict(origin))
    store.finish_stage_run(stage_run.id, "completed")
    store.finish_pipeline_run(run.id, "completed")
    return checkpoint


def _handoff_facts(h: r.Handoff) -> dict:
    return {"id": h.id, "from_stage": h.from_stage, "to_stage": h.to_stage,
            "criterion": h.criterion, "chosen_step": h.chosen_step,
            "chosen_checkpoint_id": h.chosen_checkpoint_id}


def checkpoint_facts(store, path: str) -> Optional[dict]:
    """Pipeline run, stage run, the handoff the stage started from and the handoffs that
    chose this checkpoint; None when the store has no record of `path`."""
    try:
        checkpoint = store.checkpoint_by_path(path)
    except UnknownRecord:
        return None
    stage_run = store.stage_run(checkpoint.stage_run_id)
    pipeline = store.pipeline_run(stage_run.pipeline_run_id)
    handoff = store.handoff(stage_run.handoff_id) if stage_run.handoff_id else None
    handed_on = [h for h in store.handoffs(pipeline.id)
                 if h.chosen_checkpoint_id == checkpoint.id]
    return {"checkpoint_id": checkpoint.id,
            "pipeline_run": {"id": pipeline.id, "name": pipeline.name, "status": pipeline.status},
            "stage_run": {"id": stage_run.id, "attempt": stage_run.attempt,
                          "mlflow_run_id": stage_run.mlflow_run_id},
            "handoff": _handoff_facts(handoff) if handoff else None,
            "handed_on": [_handoff_facts(h) for h in handed_on]}
