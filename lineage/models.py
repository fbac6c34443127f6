"""SQLAlchemy models of the lineage schema: the single source of truth for migrations.

Alembic autogenerates from `Base.metadata`; constraint names come from the naming
convention so that migrations (and SQLite batch rebuilds) can refer to them by name.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Optional

from sqlalchemy import (JSON, BigInteger, Boolean, DateTime, Float, ForeignKey, Index, Integer,
                        MetaData, String, Text, UniqueConstraint)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# `crashed`: left `running` by an owner process that is gone (lineage.owners).
RUN_STATUSES = ("running", "completed", "failed", "preempted", "crashed")
CHECKPOINT_FORMATS = ("deepspeed", "universal", "hf")
STUDY_KINDS = ("selection",)
STUDY_STATUSES = ("running", "completed", "failed")


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON, datetime: DateTime(timezone=True)}


class PipelineRun(Base):
    __tablename__ = "pipeline_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    config: Mapped[dict[str, Any]]
    config_hash: Mapped[str] = mapped_column(String(64), index=True)
    seed: Mapped[int] = mapped_column(BigInteger)
    code_version: Mapped[str] = mapped_column(String(100))
    prefect_flow_run_id: Mapped[Optional[str]] = mapped_column(String(64))
    mlflow_run_id: Mapped[Optional[str]] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(20))
    started_at: Mapped[datetime]
    ended_at: Mapped[Optional[datetime]]
    # The process running it; see StageRun.
    owner_host: Mapped[Optional[str]] = mapped_column(String(255))
    owner_pid: Mapped[Optional[int]] = mapped_column(Integer)
    owner_pid_start: Mapped[Optional[int]] = mapped_column(BigInteger)

    stage_runs: Mapped[list["StageRun"]] = relationship(back_populates="pipeline_run")


class StageRun(Base):
    __tablename__ = "stage_runs"
    # Attempt numbers are computed as max+1; this constraint turns a concurrent
    # duplicate into an IntegrityError that the store retries.
    __table_args__ = (UniqueConstraint("pipeline_run_id", "stage", "attempt"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    pipeline_run_id: Mapped[int] = mapped_column(ForeignKey("pipeline_runs.id"), index=True)
    stage: Mapped[str] = mapped_column(String(20))
    attempt: Mapped[int] = mapped_column(Integer)
    # use_alter: stage_runs and handoffs refer to each other.
    handoff_id: Mapped[Optional[int]] = mapped_column(
        ForeignKey("handoffs.id", use_alter=True))
    parallel_config: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(String(20))
    started_at: Mapped[datetime]
    ended_at: Mapped[Optional[datetime]]
    mlflow_run_id: Mapped[Optional[str]] = mapped_column(String(64))
    resumed_from_checkpoint_id: Mapped[Optional[int]] = mapped_column(
        ForeignKey("checkpoints.id", use_alter=True))
    # The process running it (host, pid, the pid's start in clock ticks after boot, which
    # tells a reused pid apart): lineage.owners marks the run `crashed` once it is gone.
    owner_host: Mapped[Optional[str]] = mapped_column(String(255))
    owner_pid: Mapped[Optional[int]] = mapped_column(Integer)
    owner_pid_start: Mapped[Optional[int]] = mapped_column(BigInteger)
    # The workers' environment fingerprint (core.fingerprint): what `baton rerun` compares.
    environment: Mapped[Optional[dict[str, Any]]]
    # What it trained and evaluated on (stages.data): one entry per dataset, with its
    # content digest, rows, format, key mapping, tokenizer and template digests, rows read.
    datasets: Mapped[Optional[list[Any]]]

    pipeline_run: Mapped[PipelineRun] = relationship(back_populates="stage_runs")


class Checkpoint(Base):
    __tablename__ = "checkpoints"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    stage_run_id: Mapped[int] = mapped_column(ForeignKey("stage_runs.id"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    tokens_seen: Mapped[int] = mapped_column(BigInteger)
    path: Mapped[str] = mapped_column(Text, index=True)
    manifest_checksum: Mapped[str] = mapped_column(String(128))
    # Identity by content (ckpt.content_digest): equal for reproductions in other places.
    content_digest: Mapped[Optional[str]] = mapped_column(String(80), index=True)
    # Tier -> outcome of its copy ({"ok", "where"} or {"ok": false, "error"}); null: run dir only.
    locations: Mapped[Optional[dict[str, Any]]]
    bytes: Mapped[int] = mapped_column(BigInteger)
    format: Mapped[str] = mapped_column(String(20))
    parallel_config: Mapped[dict[str, Any]]
    metrics: Mapped[dict[str, Any]]
    committed: Mapped[bool] = mapped_column(Boolean)
    created_at: Mapped[datetime]


class Handoff(Base):
    __tablename__ = "handoffs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    from_stage_run_id: Mapped[int] = mapped_column(ForeignKey("stage_runs.id"), index=True)
    to_stage: Mapped[str] = mapped_column(String(20))
    to_stage_run_id: Mapped[Optional[int]] = mapped_column(ForeignKey("stage_runs.id"), index=True)
    criterion: Mapped[str] = mapped_column(String(50))
    criterion_params: Mapped[dict[str, Any]]
    chosen_checkpoint_id: Mapped[int] = mapped_column(ForeignKey("checkpoints.id"))
    chosen_step: Mapped[int] = mapped_column(Integer)
    entropy: Mapped[Optional[float]] = mapped_column(Float)
    reason: Mapped[str] = mapped_column(Text)
    carry_policy: Mapped[dict[str, Any]]
    reshard: Mapped[Optional[dict[str, Any]]]
    equivalence: Mapped[Optional[dict[str, Any]]]
    created_at: Mapped[datetime]

    candidates: Mapped[list["HandoffCandidate"]] = relationship(
        order_by="HandoffCandidate.rank")


class HandoffCandidate(Base):
    __tablename__ = "handoff_candidates"
    __table_args__ = (UniqueConstraint("handoff_id", "checkpoint_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    handoff_id: Mapped[int] = mapped_column(ForeignKey("handoffs.id"), index=True)
    checkpoint_id: Mapped[int] = mapped_column(ForeignKey("checkpoints.id"))
    metrics: Mapped[dict[str, Any]]
    eligible: Mapped[bool] = mapped_column(Boolean)
    rejection_reason: Mapped[Optional[str]] = mapped_column(Text)
    rank: Mapped[Optional[int]] = mapped_column(Integer)


class Event(Base):
    __tablename__ = "events"
    __table_args__ = (Index("ix_events_stage_run_id_step", "stage_run_id", "step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    stage_run_id: Mapped[int] = mapped_column(ForeignKey("stage_runs.id"))
    role: Mapped[str] = mapped_column(String(50))
    kind: Mapped[str] = mapped_column(String(50))
    step: Mapped[Optional[int]] = mapped_column(Integer)
    detail: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]


class JournalSegment(Base):
    __tablename__ = "journal_segments"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    stage_run_id: Mapped[int] = mapped_column(ForeignKey("stage_runs.id"), index=True)
    step_start: Mapped[int] = mapped_column(Integer)
    step_end: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    checksum: Mapped[str] = mapped_column(String(128))
    sample_count: Mapped[int] = mapped_column(Integer)


class Study(Base):
    """A study over checkpoints of one stage run; `selection`: which SFT checkpoint RL
    should start from, by correlating pre-RL diagnostics with a short RL's outcome."""

    __tablename__ = "studies"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(20))
    from_stage_run_id: Mapped[int] = mapped_column(ForeignKey("stage_runs.id"), index=True)
    status: Mapped[str] = mapped_column(String(20))
    config: Mapped[dict[str, Any]]
    # The correlation table and whatever else the analysis computed.
    results: Mapped[Optional[dict[str, Any]]]
    # The diagnostic that best predicted the outcome, and which way: +1 higher is better.
    winner_diagnostic: Mapped[Optional[str]] = mapped_column(String(50))
    winner_direction: Mapped[Optional[int]] = mapped_column(Integer)
    verdict: Mapped[Optional[str]] = mapped_column(Text)
    mlflow_run_id: Mapped[Optional[str]] = mapped_column(String(64))
    created_at: Mapped[datetime]
    ended_at: Mapped[Optional[datetime]]

    candidates: Mapped[list["StudyCandidate"]] = relationship(
        order_by="StudyCandidate.step")


class StudyCandidate(Base):
    __tablename__ = "study_candidates"
    __table_args__ = (UniqueConstraint("study_id", "checkpoint_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id"), index=True)
    checkpoint_id: Mapped[int] = mapped_column(ForeignKey("checkpoints.id"))
    step: Mapped[int] = mapped_column(Integer)
    diagnostics: Mapped[dict[str, Any]]
    # The short RL run's {"start_reward", "final_reward", "gain"}; None until it ran.
    outcome: Mapped[Optional[dict[str, Any]]]
    rl_run_dir: Mapped[Optional[str]] = mapped_column(Text)
    mlflow_run_id: Mapped[Optional[str]] = mapped_column(String(64))
