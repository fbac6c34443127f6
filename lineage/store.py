"""`LineageStore`: the typed verbs that record a pipeline's lineage, and its queries.

Every write is one transaction, retried as a whole on lock contention (SQLite) or a
lost attempt-number race (PostgreSQL); every read returns detached frozen records.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, TypeVar

from sqlalchemy import func, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from core.processes import ProcessIdentity
from lineage import models as m
from lineage import owners
from lineage import queries as q
from lineage import records as r
from lineage import schema
from lineage.engine import WRITE_OPTION, make_engine, with_retries
from lineage.errors import (InvalidValue, LineageConflict, StoreNotFound, StoreUnreachable,
                            UnknownRecord)
from lineage.studies import StudyVerbs
from lineage.urls import normalize_path, safe_url, sqlite_path

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CandidateSpec:
    """One candidate checkpoint of a handoff, as the selection computed it."""

    checkpoint_id: int
    metrics: Mapping[str, Any]
    eligible: bool = True
    rejection_reason: Optional[str] = None
    rank: Optional[int] = None


def _check_choice(key: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise InvalidValue(key, value, "one of " + ", ".join(allowed))


class LineageStore(StudyVerbs):
    """Open with `LineageStore.open(url)`; the schema is migrated to head on first use.
    The verbs of selection studies come from `StudyVerbs` (lineage.studies)."""

    def __init__(self, engine: Engine):
        self._engine = engine
        self._writer = engine.execution_options(**{WRITE_OPTION: True})
        self.url = safe_url(engine.url)

    @classmethod
    def open(cls, url: str, *, create: bool = True) -> "LineageStore":
        """Connect and upgrade to head. `create=False` refuses a missing SQLite file
        (read-only commands should not leave an empty store behind)."""
        path = sqlite_path(url)
        if path is not None and not create and not path.exists():
            raise StoreNotFound(safe_url(url), str(path))
        engine = make_engine(url)
        try:
            schema.upgrade(engine)
        except (DBAPIError, OSError) as exc:  # OSError: the SQLite directory cannot be made
            engine.dispose()
            orig = getattr(exc, "orig", None) or exc
            cause = (str(orig).strip().splitlines() or [type(orig).__name__])[0]
            raise StoreUnreachable(safe_url(url), cause) from None
        except BaseException:
            engine.dispose()
            raise
        store = cls(engine)
        try:
            store._mark_crashed()
        except DBAPIError as exc:  # e.g. a read-only copy of the store: still worth reading
            log.warning("could not mark crashed runs in %s: %s", store.url,
                        (str(getattr(exc, "orig", exc)).strip().splitlines() or ["?"])[0])
        return store

    def _mark_crashed(self) -> None:
        """Runs left `running` by a dead owner on this host become `crashed` (lineage.owners)."""
        if self._read(owners.any_orphaned):
            for kind, run_id in self._write(owners.mark_crashed):
                log.warning("%s %d was left running by a process that is gone: marked crashed",
                            kind, run_id)

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> "LineageStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _write(self, fn: Callable[[Session], T]) -> T:
        def once() -> T:
            with Session(self._writer, expire_on_commit=False) as session, session.begin():
                return fn(session)
        return with_retries(once)

    def _read(self, fn: Callable[[Session], T]) -> T:
        def once() -> T:
            with Session(self._engine) as session, session.begin():
                return fn(session)
        return with_retries(once)

    # -- pipeline runs -------------------------------------------------------------

    def record_pipeline_run(self, name: str, config: Mapping[str, Any], config_hash: str,
                            seed: int, code_version: str, *,
                            prefect_flow_run_id: Optional[str] = None,
                            mlflow_run_id: Optional[str] = None,
                            started_at: Optional[datetime] = None,
                            owner: Optional[ProcessIdentity] = None) -> r.PipelineRun:
        """`owner`: the process that runs it (default: this one), see lineage.owners."""
        def write(s: Session) -> r.PipelineRun:
            row = m.PipelineRun(
                name=name, config=dict(config), config_hash=config_hash, seed=seed,
                code_version=code_version, prefect_flow_run_id=prefect_flow_run_id,
                mlflow_run_id=mlflow_run_id, status="running",
                started_at=started_at or m.utcnow(), **owners.owner_columns(owner))
            s.add(row)
            s.flush()
            return r.PipelineRun.of(row)
        return self._write(write)

    def finish_pipeline_run(self, pipeline_run_id: int, status: str, *,
                            ended_at: Optional[datetime] = None) -> r.PipelineRun:
        _check_choice("status", status, m.RUN_STATUSES)

        def write(s: Session) -> r.PipelineRun:
            row = q.get(s, m.PipelineRun, pipeline_run_id, "pipeline run", self.url)
            row.status, row.ended_at = status, ended_at or m.utcnow()
            return r.PipelineRun.of(row)
        return self._write(write)

    def set_pipeline_mlflow_run(self, pipeline_run_id: int, mlflow_run_id: str) -> r.PipelineRun:
        def write(s: Session) -> r.PipelineRun:
            row = q.get(s, m.PipelineRun, pipeline_run_id, "pipeline run", self.url)
            row.mlflow_run_id = mlflow_run_id
            return r.PipelineRun.of(row)
        return self._write(write)

    # -- stage runs ----------------------------------------------------------------

    def record_stage_run(self, pipeline_run_id: int, stage: str,
                         parallel_config: Mapping[str, Any], *,
                         handoff_id: Optional[int] = None,
                         resumed_from_checkpoint_id: Optional[int] = None,
                         mlflow_run_id: Optional[str] = None,
                         started_at: Optional[datetime] = None,
                         owner: Optional[ProcessIdentity] = None) -> r.StageRun:
        """A new attempt of `stage` (numbered 1, 2, … per pipeline run and stage). When it
        starts from `handoff_id`, that handoff is linked to it in the same transaction.
        `owner`: the process that runs it (default: this one), see lineage.owners."""
        def write(s: Session) -> r.StageRun:
            q.get(s, m.PipelineRun, pipeline_run_id, "pipeline run", self.url)
            if resumed_from_checkpoint_id is not None:
                q.get(s, m.Checkpoint, resumed_from_checkpoint_id, "checkpoint", self.url)
            last = s.scalar(select(func.max(m.StageRun.attempt)).where(
                m.StageRun.pipeline_run_id == pipeline_run_id, m.StageRun.stage == stage))
            row = m.StageRun(
                pipeline_run_id=pipeline_run_id, stage=stage, attempt=(last or 0) + 1,
                parallel_config=dict(parallel_config), status="running",
                started_at=started_at or m.utcnow(), mlflow_run_id=mlflow_run_id,
                resumed_from_checkpoint_id=resumed_from_checkpoint_id,
                **owners.owner_columns(owner))
            s.add(row)
            s.flush()
            if handoff_id is not None:
                self._link(s, handoff_id, row)
            return r.StageRun.of(row)
        return self._write(write)

    def finish_stage_run(self, stage_run_id: int, status: str, *,
                         ended_at: Optional[datetime] = None) -> r.StageRun:
        _check_choice("status", status, m.RUN_STATUSES)

        def write(s: Session) -> r.StageRun:
            row = q.get(s, m.StageRun, stage_run_id, "stage run", self.url)
            row.status, row.ended_at = status, ended_at or m.utcnow()
            return r.StageRun.of(row)
        return self._write(write)

    def set_stage_mlflow_run(self, stage_run_id: int, mlflow_run_id: str) -> r.StageRun:
        def write(s: Session) -> r.StageRun:
            row = q.get(s, m.StageRun, stage_run_id, "stage run", self.url)
            row.mlflow_run_id = mlflow_run_id
            return r.StageRun.of(row)
        return self._write(write)

    def set_stage_environment(self, stage_run_id: int, environment: Mapping[str, Any]) -> r.StageRun:
        def write(s: Session) -> r.StageRun:
            row = q.get(s, m.StageRun, stage_run_id, "stage run", self.url)
            row.environment = dict(environment)
            return r.StageRun.of(row)
        return self._write(write)

    def set_stage_datasets(self, stage_run_id: int, datasets: list[Mapping[str, Any]]) -> r.StageRun:
        def write(s: Session) -> r.StageRun:
            row = q.get(s, m.StageRun, stage_run_id, "stage run", self.url)
            row.datasets = [dict(d) for d in datasets]
            return r.StageRun.of(row)
        return self._write(write)

    # -- checkpoints, handoffs -----------------------------------------------------

    def record_checkpoint(self, stage_run_id: int, step: int, path: str | Path,
                          manifest_checksum: str, bytes: int, format: str,
                          parallel_config: Mapping[str, Any], *, tokens_seen: int = 0,
                          metrics: Optional[Mapping[str, Any]] = None,
                          committed: bool = True,
                          content_digest: Optional[str] = None,
                          locations: Optional[Mapping[str, Any]] = None) -> r.Checkpoint:
        _check_choice("format", format, m.CHECKPOINT_FORMATS)

        def write(s: Session) -> r.Checkpoint:
            run = q.get(s, m.StageRun, stage_run_id, "stage run", self.url)
            row = m.Checkpoint(
                stage_run_id=stage_run_id, step=step, tokens_seen=tokens_seen,
                path=normalize_path(path), manifest_checksum=manifest_checksum, bytes=bytes,
                format=format, parallel_config=dict(parallel_config),
                metrics=dict(metrics or {}), committed=committed, created_at=m.utcnow(),
                content_digest=content_digest,
                locations=dict(locations) if locations else None)
            s.add(row)
            s.flush()
            return r.Checkpoint.of(row, run.stage)
        return self._write(write)

    def record_handoff(self, from_stage_run_id: int, to_stage: str, criterion: str,
                       chosen_checkpoint_id: int, reason: str,
                       candidates: Sequence[CandidateSpec], *,
                       criterion_params: Optional[Mapping[str, Any]] = None,
                       entropy: Optional[float] = None,
                       carry_policy: Optional[Mapping[str, Any]] = None,
                       reshard: Optional[Mapping[str, Any]] = None,
                       equivalence: Optional[Mapping[str, Any]] = None) -> r.Handoff:
        """The choice made at a stage boundary and every candidate considered, atomically."""
        ids = [c.checkpoint_id for c in candidates]
        if candidates and chosen_checkpoint_id not in ids:
            raise LineageConflict(
                f"handoff to {to_stage}: chosen checkpoint {chosen_checkpoint_id} is not among "
                f"the candidates {ids}; record the chosen checkpoint as a candidate too")

        def write(s: Session) -> r.Handoff:
            q.get(s, m.StageRun, from_stage_run_id, "stage run", self.url)
            chosen = q.get(s, m.Checkpoint, chosen_checkpoint_id, "checkpoint", self.url)
            for cid in ids:
                q.get(s, m.Checkpoint, cid, "checkpoint", self.url)
            row = m.Handoff(
                from_stage_run_id=from_stage_run_id, to_stage=to_stage, criterion=criterion,
                criterion_params=dict(criterion_params or {}),
                chosen_checkpoint_id=chosen_checkpoint_id, chosen_step=chosen.step,
                entropy=entropy, reason=reason, carry_policy=dict(carry_policy or {}),
                reshard=dict(reshard) if reshard is not None else None,
                equivalence=dict(equivalence) if equivalence is not None else None,
                created_at=m.utcnow())
            row.candidates = [
                m.HandoffCandidate(checkpoint_id=c.checkpoint_id, metrics=dict(c.metrics),
                                   eligible=c.eligible, rejection_reason=c.rejection_reason,
                                   rank=c.rank) for c in candidates]
            s.add(row)
            s.flush()
            return q.handoff_record(s, row)
        return self._write(write)

    def set_handoff_reshard(self, handoff_id: int, *, reshard: Optional[Mapping[str, Any]] = None,
                            equivalence: Optional[Mapping[str, Any]] = None) -> r.Handoff:
        """Resharding runs after selection; its transform and check are added here."""
        def write(s: Session) -> r.Handoff:
            row = q.get(s, m.Handoff, handoff_id, "handoff", self.url)
            if reshard is not None:
                row.reshard = dict(reshard)
            if equivalence is not None:
                row.equivalence = dict(equivalence)
            return q.handoff_record(s, row)
        return self._write(write)

    def link_handoff_to_stage_run(self, handoff_id: int, stage_run_id: int) -> r.Handoff:
        """Mark `stage_run_id` as the downstream run of a handoff (e.g. RM handed to RL)."""
        def write(s: Session) -> r.Handoff:
            run = q.get(s, m.StageRun, stage_run_id, "stage run", self.url)
            return self._link(s, handoff_id, run)
        return self._write(write)

    def _link(self, s: Session, handoff_id: int, run: m.StageRun) -> r.Handoff:
        row = q.get(s, m.Handoff, handoff_id, "handoff", self.url)
        if row.to_stage != run.stage:
            raise LineageConflict(
                f"handoff {handoff_id} goes to stage {row.to_stage!r} but stage run {run.id} is "
                f"a {run.stage!r} run; link it to a {row.to_stage} stage run")
        row.to_stage_run_id = run.id
        if run.handoff_id is None:
            run.handoff_id = handoff_id
        s.flush()
        return q.handoff_record(s, row)

    # -- events and the RL journal -------------------------------------------------

    def record_event(self, stage_run_id: int, role: str, kind: str, *,
                     step: Optional[int] = None,
                     detail: Optional[Mapping[str, Any]] = None) -> r.Event:
        def write(s: Session) -> r.Event:
            q.get(s, m.StageRun, stage_run_id, "stage run", self.url)
            row = m.Event(stage_run_id=stage_run_id, role=role, kind=kind, step=step,
                          detail=dict(detail or {}), created_at=m.utcnow())
            s.add(row)
            s.flush()
            return r.Event.of(row)
        return self._write(write)

    def record_journal_segment(self, stage_run_id: int, step_start: int, step_end: int,
                               path: str | Path, checksum: str,
                               sample_count: int) -> r.JournalSegment:
        if step_end < step_start:
            raise InvalidValue("step_end", step_end, f">= step_start ({step_start})")

        def write(s: Session) -> r.JournalSegment:
            q.get(s, m.StageRun, stage_run_id, "stage run", self.url)
            row = m.JournalSegment(stage_run_id=stage_run_id, step_start=step_start,
                                   step_end=step_end, path=normalize_path(path),
                                   checksum=checksum, sample_count=sample_count)
            s.add(row)
            s.flush()
            return r.JournalSegment.of(row)
        return self._write(write)

    # -- queries -------------------------------------------------------------------

    def pipeline_run(self, pipeline_run_id: int) -> r.PipelineRun:
        return self._read(lambda s: r.PipelineRun.of(
            q.get(s, m.PipelineRun, pipeline_run_id, "pipeline run", self.url)))

    def pipeline_runs(self) -> list[r.PipelineRun]:
        return self._read(q.pipeline_runs)

    def latest_pipeline_run(self) -> Optional[r.PipelineRun]:
        return self._read(q.latest_pipeline_run)

    def stage_run(self, stage_run_id: int) -> r.StageRun:
        return self._read(lambda s: r.StageRun.of(
            q.get(s, m.StageRun, stage_run_id, "stage run", self.url)))

    def stage_runs(self, pipeline_run_id: int) -> list[r.StageRun]:
        def read(s: Session) -> list[r.StageRun]:
            q.get(s, m.PipelineRun, pipeline_run_id, "pipeline run", self.url)
            return q.stage_runs(s, pipeline_run_id)
        return self._read(read)

    def checkpoint(self, checkpoint_id: int) -> r.Checkpoint:
        return self._read(lambda s: q.checkpoint_record(
            s, q.get(s, m.Checkpoint, checkpoint_id, "checkpoint", self.url)))

    def checkpoints(self, stage_run_id: int) -> list[r.Checkpoint]:
        def read(s: Session) -> list[r.Checkpoint]:
            q.get(s, m.StageRun, stage_run_id, "stage run", self.url)
            return q.checkpoints(s, stage_run_id)
        return self._read(read)

    def checkpoint_by_path(self, path: str | Path) -> r.Checkpoint:
        def read(s: Session) -> r.Checkpoint:
            found = q.checkpoint_by_path(s, normalize_path(path))
            if found is None:
                raise UnknownRecord("checkpoint at path", str(path), self.url, q.HINT)
            return found
        return self._read(read)

    def handoff(self, handoff_id: int) -> r.Handoff:
        return self._read(lambda s: q.handoff_record(
            s, q.get(s, m.Handoff, handoff_id, "handoff", self.url)))

    def handoffs(self, pipeline_run_id: int) -> list[r.Handoff]:
        return self._read(lambda s: q.handoffs(s, pipeline_run_id))

    def handoffs_into(self, stage_run_id: int) -> list[r.Handoff]:
        return self._read(lambda s: q.handoffs_into(s, stage_run_id))

    def events(self, stage_run_id: int) -> list[r.Event]:
        def read(s: Session) -> list[r.Event]:
            q.get(s, m.StageRun, stage_run_id, "stage run", self.url)
            return q.events(s, stage_run_id)
        return self._read(read)

    def journal_segments(self, stage_run_id: int) -> list[r.JournalSegment]:
        return self._read(lambda s: q.journal_segments(s, stage_run_id))

    def ancestry(self, checkpoint_id: int) -> list[r.AncestryLink]:
        return self._read(lambda s: q.ancestry(s, checkpoint_id, self.url))
