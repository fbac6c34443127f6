"""`rerun_stage`: re-run the downstream stage of a recorded handoff and compare.

The input is re-materialised from the record (its manifest checksum must match what
the handoff recorded), the stage runs again with the recorded config and seed as a
new attempt linked to the same handoff, and the verdict says whether the per-step
trace and the final checkpoint reproduced bit for bit.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from baton.errors import BatonError


class RerunNotPossible(BatonError):
    def __init__(self, handoff_id: int, why: str):
        self.handoff_id = handoff_id
        super().__init__(f"handoff {handoff_id}: cannot re-run: {why}")


def _recorded_input(handoff) -> Path:
    from ckpt import manifest as manifest_io

    reshard = handoff.reshard or {}
    path = Path(reshard.get("output", ""))
    if not reshard or not (path / manifest_io.MANIFEST).is_file():
        raise RerunNotPossible(handoff.id, f"its input checkpoint {path} is gone")
    actual = manifest_io.checksum_of(path / manifest_io.MANIFEST)
    if actual != reshard["output_manifest_sha256"]:
        raise RerunNotPossible(handoff.id, f"{path}/manifest.json has sha256 {actual[:16]}…, the "
                               f"handoff recorded {reshard['output_manifest_sha256'][:16]}…")
    manifest_io.verify(path)  # every file, before anything is loaded from it
    return path


def _next_attempt_dir(reruns: Path, handoff_id: int) -> Path:
    """`<pipeline root>/reruns/handoff-<id>-<n>`: each re-run keeps its own files."""
    n = len(list(reruns.glob(f"handoff-{handoff_id}-*"))) + 1 if reruns.is_dir() else 1
    return reruns / f"handoff-{handoff_id}-{n}"


@task(name="rerun-stage", cache_policy=NO_CACHE)
def rerun_task(handoff_id: int, overrides: list[str]) -> dict:
    from baton.config import compose
    from baton.config.compose import from_dict
    from ckpt.compat import read_meta
    from ckpt import manifest as manifest_io
    from ckpt.reproduce import compare_runs
    from flows.recording import Recording
    from stages.launch import launch_stage

    rec = Recording(compose(overrides))
    handoff = rec.store.handoff(handoff_id)
    if handoff.to_stage_run_id is None:
        raise RerunNotPossible(handoff_id, f"no {handoff.to_stage} stage run started from it")
    original_run = rec.store.stage_run(handoff.to_stage_run_id)
    originals = [c for c in rec.store.checkpoints(original_run.id) if Path(c.path).is_dir()]
    if not originals:
        raise RerunNotPossible(handoff_id, f"stage run {original_run.id} has no checkpoint left")
    original_final = Path(originals[-1].path)
    _recorded_input(handoff)
    meta = read_meta(original_final, manifest_io.verify(original_final, checksums=False))
    attempt_dir = _next_attempt_dir(original_final.parents[2] / "reruns", handoff_id)
    config = dict(meta["config"], resume=None)
    config["run"] = dict(config["run"], dir=str(attempt_dir))
    cfg = from_dict(config)
    stage_run = rec.start_stage(original_run.pipeline_run_id, handoff.to_stage,
                                original_run.parallel_config, handoff_id=handoff_id)
    rec.log_handoff(handoff_id, stage_run, primary=True)
    print(f"[rerun] handoff {handoff_id}: {handoff.to_stage} attempt {stage_run.attempt} in {attempt_dir}", flush=True)
    result = launch_stage(cfg, Path(meta["model_dir"]), {"rerun_of_stage_run": original_run.id,
                                                         "handoffs": [handoff_id]})
    rec.stage_outputs(stage_run, attempt_dir, result.checkpoints)
    rerun_final = Path(result.checkpoints[-1]["path"]) if result.checkpoints else None
    verdict = compare_runs(original_final.parents[1] / "metrics.jsonl",
                           attempt_dir / handoff.to_stage / "metrics.jsonl", original_final, rerun_final)
    rec.store.record_event(stage_run.id, "trainer", "rerun",
                           detail={"handoff_id": handoff_id, "original_stage_run": original_run.id,
                                   **asdict(verdict)})
    rec.finish_stage(stage_run.id, result.status)
    print(f"[rerun] {verdict.summary()}", flush=True)
    return {"stage_run_id": stage_run.id, "reproduced": verdict.reproduced,
            "summary": verdict.summary(), "verdict": json.loads(json.dumps(asdict(verdict), default=str))}


@flow(name="rerun_stage", log_prints=True)
def rerun_stage(handoff_id: int, overrides: list[str] | None = None) -> dict:
    return rerun_task(handoff_id, list(overrides or []))
