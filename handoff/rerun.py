"""What re-running a handoff's downstream stage means: which input it starts from (the
recorded one, checksum-checked), which config and folder the new attempt gets, and how
its result is compared with the original (the verdict).

Wiring (lineage records, launching) is flows.rerun; this module decides.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ckpt import manifest as manifest_io
from ckpt.compat import read_meta
from ckpt.layout import stage_dir
from ckpt.reproduce import compare_runs
from core.config.compose import from_dict
from core.errors import BatonError
from stages.run_files import METRICS

RERUNS_DIR = "reruns"


class RerunNotPossible(BatonError):
    def __init__(self, handoff_id: int, why: str):
        self.handoff_id = handoff_id
        super().__init__(f"handoff {handoff_id}: cannot re-run: {why}")


def recorded_input(handoff) -> Path:
    """The handoff's input checkpoint, only if its manifest is the one recorded and every
    file checks out (before anything is loaded from it)."""
    reshard = handoff.reshard or {}
    path = Path(reshard.get("output", ""))
    if not reshard or not (path / manifest_io.MANIFEST).is_file():
        raise RerunNotPossible(handoff.id, f"its input checkpoint {path} is gone")
    actual = manifest_io.checksum_of(path / manifest_io.MANIFEST)
    if actual != reshard["output_manifest_sha256"]:
        raise RerunNotPossible(handoff.id, f"{path}/manifest.json has sha256 {actual[:16]}…, the "
                               f"handoff recorded {reshard['output_manifest_sha256'][:16]}…")
    manifest_io.verify(path)
    return path


def next_attempt_dir(reruns: Path, handoff_id: int) -> Path:
    """`<pipeline root>/reruns/handoff-<id>-<n>`: each re-run keeps its own files."""
    n = len(list(reruns.glob(f"handoff-{handoff_id}-*"))) + 1 if reruns.is_dir() else 1
    return reruns / f"handoff-{handoff_id}-{n}"


@dataclass
class RerunPlan:
    original_final: Path
    attempt_dir: Path
    cfg: object
    model_dir: Path


def plan_rerun(handoff, original_run_id: int, checkpoint_paths: list[str]) -> RerunPlan:
    """The recorded config and seed, resume off, in a fresh attempt folder next to the
    pipeline's run; refused if the original left no checkpoint or the input changed."""
    originals = [Path(p) for p in checkpoint_paths if Path(p).is_dir()]
    if not originals:
        raise RerunNotPossible(handoff.id, f"stage run {original_run_id} has no checkpoint left")
    original_final = originals[-1]
    recorded_input(handoff)
    meta = read_meta(original_final, manifest_io.verify(original_final, checksums=False))
    attempt_dir = next_attempt_dir(original_final.parents[2] / RERUNS_DIR, handoff.id)
    config = dict(meta["config"], resume=None)
    config["run"] = dict(config["run"], dir=str(attempt_dir))
    return RerunPlan(original_final, attempt_dir, from_dict(config), Path(meta["model_dir"]))


def verdict(plan: RerunPlan, stage: str, rerun_checkpoints: list[dict]):
    """Per-step trace and final checkpoint of the re-run against the original's."""
    rerun_final = Path(rerun_checkpoints[-1]["path"]) if rerun_checkpoints else None
    return compare_runs(plan.original_final.parents[1] / METRICS,
                        stage_dir(plan.attempt_dir, stage) / METRICS, plan.original_final, rerun_final)
