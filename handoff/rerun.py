"""What re-running a handoff's downstream stage means: which input it starts from (the
recorded one, checksum-checked), which config and folder the new attempt gets, and how
its result is compared with the original (the verdict).

Wiring (lineage records, launching) is flows.rerun; this module decides.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ckpt import manifest as manifest_io
from ckpt.content_digest import content_digest
from ckpt.compat import read_meta
from ckpt.layout import stage_dir
from ckpt.reproduce import compare_runs
from core.config.compose import from_dict
from core.errors import BatonError
from stages.run_files import ENVIRONMENT, METRICS

RERUNS_DIR = "reruns"


class RerunNotPossible(BatonError):
    def __init__(self, handoff_id: int, why: str):
        self.handoff_id = handoff_id
        super().__init__(f"handoff {handoff_id}: cannot re-run: {why}")


def recorded_input(handoff) -> Path:
    """The handoff's input checkpoint, only if it holds what the handoff recorded and every
    file checks out (before anything is loaded from it)."""
    reshard = handoff.reshard or {}
    path = Path(reshard.get("output", ""))
    if not reshard or not (path / manifest_io.MANIFEST).is_file():
        raise RerunNotPossible(handoff.id, f"its input checkpoint {path} is gone")
    _check_recorded_identity(handoff.id, path, reshard)
    manifest_io.verify(path)
    return path


def _check_recorded_identity(handoff_id: int, path: Path, reshard: dict) -> None:
    """By content digest when the record has one (what the checkpoint holds); records
    written before content digests name only the manifest's sha256."""
    recorded = reshard.get("output_content_digest")
    if recorded:
        found = content_digest(manifest_io.read(path))
        what = "content digest"
    else:
        recorded = reshard["output_manifest_sha256"]
        found = manifest_io.checksum_of(path / manifest_io.MANIFEST)
        what = "manifest.json sha256"
    if found != recorded:
        raise RerunNotPossible(handoff_id, f"its input checkpoint {path} has {what} {found}, the "
                               f"handoff recorded {recorded}: it no longer holds what was handed off")


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
    originals: list[Path] = field(default_factory=list)
    """Every checkpoint the original kept, oldest first (the search for the first
    differing one)."""
    data: dict | None = None
    """The data plan the original trained on (meta.json), None for the built-in tasks."""


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
    return RerunPlan(original_final, attempt_dir, from_dict(config), Path(meta["model_dir"]), originals,
                     meta.get("data_plan"))


def _fingerprint_in(directory: Path) -> dict | None:
    path = directory / ENVIRONMENT
    return json.loads(path.read_text()) if path.is_file() else None


def verdict(plan: RerunPlan, stage: str, rerun_checkpoints: list[dict], original_fingerprint: dict | None,
            rerun_data: dict | None = None):
    """Per-step trace, the checkpoints both kept and the final one of the re-run against the
    original's, and the differences between the two environment fingerprints
    (`original_fingerprint`: the one lineage recorded for the original stage run), and
    each dataset whose content changed since (`rerun_data`: the re-run's data plan)."""
    from stages.data.resume import changes

    reruns = [Path(c["path"]) for c in rerun_checkpoints if Path(c["path"]).is_dir()]
    rerun_final = Path(rerun_checkpoints[-1]["path"]) if rerun_checkpoints else None
    outcome = compare_runs(plan.original_final.parents[1] / METRICS,
                        stage_dir(plan.attempt_dir, stage) / METRICS, plan.original_final, rerun_final,
                        original_checkpoints=plan.originals, rerun_checkpoints=reruns,
                        environments=(original_fingerprint or _fingerprint_in(plan.original_final.parents[1]),
                                      _fingerprint_in(stage_dir(plan.attempt_dir, stage))))
    outcome.data_differences = changes(plan.data, rerun_data, then="the original")
    return outcome
