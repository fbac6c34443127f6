"""The decisions of a handoff, apart from its wiring (flows.handoff_task): which candidate is
chosen, which model the next stage loads it as, whether the chosen checkpoint is used
as is or resharded to the next stage's layout, and where a resharded copy goes.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ckpt import manifest as manifest_io
from ckpt.content_digest import content_digest_of
from ckpt.parallel_layout import Layout, Sharding
from handoff.selection import Candidate, select

HANDOFFS_DIR = "handoffs"


def choose(candidates: list[Candidate], selection, study=None) -> tuple[Candidate, str]:
    """The candidate the configured criterion picks, and why (see handoff.selection).
    `study`: the newest selection study's `StudyWinner`, for criterion=study."""
    return select(candidates, selection.criterion, score_metric=selection.score_metric,
                  entropy_floor=selection.entropy_floor, score_tolerance=selection.score_tolerance,
                  study=study)


def loaded_as(plan) -> str:
    """The stage whose model the chosen checkpoint becomes: a policy becomes the next
    stage's model; a reward model is loaded downstream as itself."""
    return plan.to_stage if plan.role == "policy" else plan.from_stage


def reshard_destination(stage_root: str | Path, name: str, handoff_id: int, chosen: str | Path) -> Path:
    """`<stage root>/handoffs/<name>-<id>/<step dir>`: one folder per recorded handoff."""
    return Path(stage_root) / HANDOFFS_DIR / f"{name}-{handoff_id}" / Path(chosen).name


def target_overrides(target: Sharding) -> list[str]:
    """The config overrides that ask `handoff.reshard` for the target layout."""
    return [f"parallel.world_size={target.world_size}", f"parallel.zero_stage={target.zero_stage}"]


@dataclass
class HandoffInput:
    """The checkpoint the next stage starts from, and what lineage records about it."""

    path: str
    reshard: dict
    equivalence: dict
    source: Sharding
    target: Sharding

    @property
    def resharded(self) -> bool:
        return self.source != self.target


def prepare_input(chosen: str | Path, dst: Path, source_cfg, target_cfg) -> HandoffInput:
    """Same layout: the chosen checkpoint is used as is. Otherwise it is converted through a
    universal checkpoint into `dst` and checked equivalent (handoff.reshard raises if not)."""
    src = Path(chosen)
    source = Layout.from_config(source_cfg).sharding
    target = Layout.from_config(target_cfg).sharding
    if source == target:
        checksum = manifest_io.checksum_of(src / manifest_io.MANIFEST)
        digest = content_digest_of(src)
        record = {"source": str(src), "source_parallel": source.to_dict(),
                  "target_parallel": target.to_dict(), "converter": "none (same layout)",
                  "input_manifest_sha256": checksum, "output_manifest_sha256": checksum,
                  "input_content_digest": digest, "output_content_digest": digest,
                  "output": str(src)}
        return HandoffInput(str(src), record, {"passed": True, "detail": "identical layout: "
                                                "the checkpoint is used as is"}, source, target)
    from handoff.reshard import reshard

    result = reshard(src, dst, target_overrides(target))
    transform = {k: v for k, v in result.to_dict().items() if k != "equivalence"}
    return HandoffInput(str(dst), {**transform, "output": str(dst)}, dict(result.equivalence),
                        source, target)


def failure_equivalence(exc: Exception) -> dict:
    """What lineage records on a handoff whose reshard failed (not equivalent, unsupported,
    or a damaged source)."""
    return {**getattr(exc, "details", {}), "passed": False, "error": str(exc)}
