"""Plain, frozen records returned by the store. Field names are what `--json` shows.

Records are detached copies: they stay valid after the session that read them closes
and can be pickled across Prefect tasks.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Optional

from lineage import models as m


def _aware(value: Optional[datetime]) -> Optional[datetime]:
    # SQLite hands back naive datetimes even for timezone=True columns; all are UTC.
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=timezone.utc)


def to_jsonable(value: Any) -> Any:
    """A record (or list/tuple of them) as JSON-ready data, datetimes in ISO 8601."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    if isinstance(value, datetime):
        return value.isoformat()
    return value


@dataclass(frozen=True)
class PipelineRun:
    id: int
    name: str
    config: dict
    config_hash: str
    seed: int
    code_version: str
    prefect_flow_run_id: Optional[str]
    mlflow_run_id: Optional[str]
    status: str
    started_at: datetime
    ended_at: Optional[datetime]
    owner_host: Optional[str] = None
    owner_pid: Optional[int] = None

    @classmethod
    def of(cls, row: m.PipelineRun) -> "PipelineRun":
        return cls(row.id, row.name, row.config, row.config_hash, row.seed, row.code_version,
                   row.prefect_flow_run_id, row.mlflow_run_id, row.status,
                   _aware(row.started_at), _aware(row.ended_at), row.owner_host, row.owner_pid)


@dataclass(frozen=True)
class StageRun:
    id: int
    pipeline_run_id: int
    stage: str
    attempt: int
    handoff_id: Optional[int]
    parallel_config: dict
    status: str
    started_at: datetime
    ended_at: Optional[datetime]
    mlflow_run_id: Optional[str]
    resumed_from_checkpoint_id: Optional[int]
    owner_host: Optional[str] = None
    owner_pid: Optional[int] = None
    environment: Optional[dict] = None
    datasets: Optional[list] = None

    @classmethod
    def of(cls, row: m.StageRun) -> "StageRun":
        return cls(row.id, row.pipeline_run_id, row.stage, row.attempt, row.handoff_id,
                   row.parallel_config, row.status, _aware(row.started_at),
                   _aware(row.ended_at), row.mlflow_run_id, row.resumed_from_checkpoint_id,
                   row.owner_host, row.owner_pid, row.environment, row.datasets)


@dataclass(frozen=True)
class Checkpoint:
    id: int
    stage_run_id: int
    stage: str
    step: int
    tokens_seen: int
    path: str
    manifest_checksum: str
    bytes: int
    format: str
    parallel_config: dict
    metrics: dict
    committed: bool
    created_at: datetime
    content_digest: Optional[str] = None
    locations: Optional[dict] = None
    """Tier -> outcome of its copy (ckpt.tiers); None: the run directory only."""

    @classmethod
    def of(cls, row: m.Checkpoint, stage: str) -> "Checkpoint":
        return cls(row.id, row.stage_run_id, stage, row.step, row.tokens_seen, row.path,
                   row.manifest_checksum, row.bytes, row.format, row.parallel_config,
                   row.metrics, row.committed, _aware(row.created_at), row.content_digest,
                   row.locations)


@dataclass(frozen=True)
class Candidate:
    """One checkpoint considered at a handoff, with every metric computed for it."""

    checkpoint_id: int
    step: int
    path: str
    metrics: dict
    eligible: bool
    rejection_reason: Optional[str]
    rank: Optional[int]
    chosen: bool


@dataclass(frozen=True)
class Handoff:
    id: int
    from_stage_run_id: int
    from_stage: str
    to_stage: str
    to_stage_run_id: Optional[int]
    criterion: str
    criterion_params: dict
    chosen_checkpoint_id: int
    chosen_step: int
    entropy: Optional[float]
    reason: str
    carry_policy: dict
    reshard: Optional[dict]
    equivalence: Optional[dict]
    created_at: datetime
    candidates: tuple[Candidate, ...]


@dataclass(frozen=True)
class Event:
    id: int
    stage_run_id: int
    role: str
    kind: str
    step: Optional[int]
    detail: dict
    created_at: datetime

    @classmethod
    def of(cls, row: m.Event) -> "Event":
        return cls(row.id, row.stage_run_id, row.role, row.kind, row.step, row.detail,
                   _aware(row.created_at))


@dataclass(frozen=True)
class JournalSegment:
    id: int
    stage_run_id: int
    step_start: int
    step_end: int
    path: str
    checksum: str
    sample_count: int

    @classmethod
    def of(cls, row: m.JournalSegment) -> "JournalSegment":
        return cls(row.id, row.stage_run_id, row.step_start, row.step_end, row.path,
                   row.checksum, row.sample_count)


@dataclass(frozen=True)
class AncestryLink:
    """One generation of a checkpoint's ancestry.

    `checkpoint` was produced by `stage_run`, which started from `handoff` (None for the
    first stage). `side_inputs` are other handoffs into the same stage run, e.g. the
    reward model handed to RL next to the policy.
    """

    checkpoint: Checkpoint
    stage_run: StageRun
    handoff: Optional[Handoff]
    side_inputs: tuple[Handoff, ...] = ()
    via: str = "handoff"
    """How the previous link reached this checkpoint: 'handoff', 'resume' or 'origin'."""


@dataclass(frozen=True)
class StudyCandidate:
    """One checkpoint of a study: its pre-RL diagnostics and, once its short RL ran,
    the outcome ({"start_reward", "final_reward", "gain"})."""

    id: int
    study_id: int
    checkpoint_id: int
    step: int
    diagnostics: dict
    outcome: Optional[dict]
    rl_run_dir: Optional[str]
    mlflow_run_id: Optional[str]

    @classmethod
    def of(cls, row: m.StudyCandidate) -> "StudyCandidate":
        return cls(row.id, row.study_id, row.checkpoint_id, row.step, row.diagnostics,
                   row.outcome, row.rl_run_dir, row.mlflow_run_id)


@dataclass(frozen=True)
class Study:
    """A study over the checkpoints of one stage run (`kind` "selection": which one RL
    should start from). `winner_direction` is +1 when a higher `winner_diagnostic` is
    better, -1 when a lower one is."""

    id: int
    kind: str
    from_stage_run_id: int
    status: str
    config: dict
    results: Optional[dict]
    winner_diagnostic: Optional[str]
    winner_direction: Optional[int]
    verdict: Optional[str]
    mlflow_run_id: Optional[str]
    created_at: datetime
    ended_at: Optional[datetime]
    candidates: tuple[StudyCandidate, ...]

    @classmethod
    def of(cls, row: m.Study) -> "Study":
        candidates = sorted(row.candidates, key=lambda c: (c.step, c.id))
        return cls(row.id, row.kind, row.from_stage_run_id, row.status, row.config, row.results,
                   row.winner_diagnostic, row.winner_direction, row.verdict, row.mlflow_run_id,
                   _aware(row.created_at), _aware(row.ended_at),
                   tuple(StudyCandidate.of(c) for c in candidates))
