"""Which checkpoints a selection study compares, refused before any RL compute is spent.

A study asks which SFT checkpoint RL should start from, so its candidates are the
committed checkpoints of one SFT stage run, and a rank correlation needs at least three
of them. Pure: the flow (flows.study) passes in what lineage recorded.
"""
from __future__ import annotations

from dataclasses import dataclass

from core.errors import BatonError

MIN_CANDIDATES = 3
STUDIED_STAGE = "sft"


class StudyNotPossible(BatonError):
    def __init__(self, detail: str, fix: str):
        super().__init__(f"baton study selection: {detail}. {fix}")


class StudyCandidateFailed(BatonError):
    """A candidate's RL run failed or left no outcome: the study records `failed`."""

    def __init__(self, step: int, detail: str, log: str):
        super().__init__(f"baton study selection: the RL run of candidate step {step} {detail}; "
                         f"its log is {log}. Fix what it reports and run the study again")


@dataclass(frozen=True)
class StudyInput:
    """One candidate: a committed checkpoint as lineage recorded it."""

    checkpoint_id: int
    path: str
    step: int


def pick_candidates(stage_run_id: int, stage: str, committed: list[StudyInput],
                    steps: list[int] | None) -> list[StudyInput]:
    """The candidates of `stage_run_id` (all committed checkpoints, or those at `steps`),
    in step order."""
    if stage != STUDIED_STAGE:
        raise StudyNotPossible(
            f"stage run #{stage_run_id} is a {stage} run; a selection study compares SFT "
            "checkpoints as starting points for RL",
            "Pass study.stage_run_id=<an sft stage run> (`baton lineage show` lists them), or "
            "leave it unset for the newest completed SFT run")
    have = sorted(committed, key=lambda c: c.step)
    if steps is not None:
        missing = sorted(set(steps) - {c.step for c in have})
        if missing:
            raise StudyNotPossible(
                f"study.steps={sorted(set(steps))}: stage run #{stage_run_id} has no committed "
                f"checkpoint at step {', '.join(map(str, missing))} (committed: "
                f"{[c.step for c in have]})", "List committed steps, or study.steps=null for all")
        have = [c for c in have if c.step in set(steps)]
    if len(have) < MIN_CANDIDATES:
        raise StudyNotPossible(
            f"stage run #{stage_run_id} offers {len(have)} committed checkpoint(s) "
            f"{[c.step for c in have]}, and a correlation needs at least {MIN_CANDIDATES}",
            "Keep more SFT checkpoints (stage.save_every, stage.keep_last) or pick another "
            "stage run with study.stage_run_id")
    return have
