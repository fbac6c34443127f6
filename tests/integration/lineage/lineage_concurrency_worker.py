"""Worker processes of the concurrency tests (spawned: each opens its own store)."""
from __future__ import annotations

import traceback

ROUNDS = 4
CHECKPOINTS_PER_RUN = 3


def record(url: str, pipeline_id: int, worker: int, barrier, errors) -> None:
    """Record ROUNDS stage runs of the same stage, each with checkpoints and an event."""
    try:
        from lineage.store import LineageStore
        with LineageStore.open(url) as store:
            barrier.wait(timeout=120)
            for i in range(ROUNDS):
                run = store.record_stage_run(pipeline_id, "sft", {"worker": worker})
                for step in range(CHECKPOINTS_PER_RUN):
                    store.record_checkpoint(run.id, step, f"/ckpt/w{worker}/r{i}/s{step}",
                                            f"sha256:{worker}-{i}-{step}", 1, "deepspeed",
                                            {"worker": worker})
                store.record_event(run.id, f"worker-{worker}", "sync", step=i,
                                   detail={"worker": worker, "round": i})
                store.finish_stage_run(run.id, "completed")
    except BaseException:
        errors.put(f"worker {worker}: {traceback.format_exc()}")
        raise


def open_fresh(url: str, barrier, results) -> None:
    """Open a store that does not exist yet, all workers at the same moment."""
    try:
        from lineage import schema
        from lineage.store import LineageStore
        barrier.wait(timeout=120)
        with LineageStore.open(url) as store:
            with store._engine.connect() as connection:
                results.put(schema.current_revision(connection))
    except BaseException:
        results.put(traceback.format_exc())
        raise
