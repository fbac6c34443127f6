"""Read side of the lineage store: functions of a Session that return frozen records."""
from __future__ import annotations

from typing import Optional

from sqlalchemy import select
from sqlalchemy.orm import Session

from lineage import models as m
from lineage import records as r
from lineage.errors import UnknownRecord

HINT = "list what is recorded with `baton lineage show`"


# Ids are 64-bit integers in every backend; a larger one (typed by hand) names nothing,
# and SQLite's driver would raise OverflowError on it rather than find no row.
MAX_ID = 2**63 - 1


def get(session: Session, model, key: int, kind: str, url: str):
    if isinstance(key, int) and not -MAX_ID <= key <= MAX_ID:
        raise UnknownRecord(kind, key, url, HINT)
    row = session.get(model, key)
    if row is None:
        raise UnknownRecord(kind, key, url, HINT)
    return row


def stage_of(session: Session, stage_run_id: int) -> str:
    return session.scalar(select(m.StageRun.stage).where(m.StageRun.id == stage_run_id))


def checkpoint_record(session: Session, row: m.Checkpoint) -> r.Checkpoint:
    return r.Checkpoint.of(row, stage_of(session, row.stage_run_id))


def handoff_record(session: Session, row: m.Handoff) -> r.Handoff:
    candidates = []
    for cand in row.candidates:
        ckpt = session.get(m.Checkpoint, cand.checkpoint_id)
        candidates.append(r.Candidate(
            checkpoint_id=cand.checkpoint_id, step=ckpt.step, path=ckpt.path,
            metrics=cand.metrics, eligible=cand.eligible,
            rejection_reason=cand.rejection_reason, rank=cand.rank,
            chosen=cand.checkpoint_id == row.chosen_checkpoint_id))
    # Ranked candidates first (best rank first), then the rejected ones by step.
    candidates.sort(key=lambda c: (c.rank is None, c.rank or 0, c.step))
    return r.Handoff(
        id=row.id, from_stage_run_id=row.from_stage_run_id,
        from_stage=stage_of(session, row.from_stage_run_id), to_stage=row.to_stage,
        to_stage_run_id=row.to_stage_run_id, criterion=row.criterion,
        criterion_params=row.criterion_params, chosen_checkpoint_id=row.chosen_checkpoint_id,
        chosen_step=row.chosen_step, entropy=row.entropy, reason=row.reason,
        carry_policy=row.carry_policy, reshard=row.reshard, equivalence=row.equivalence,
        created_at=r._aware(row.created_at), candidates=tuple(candidates))


def pipeline_runs(session: Session) -> list[r.PipelineRun]:
    rows = session.scalars(select(m.PipelineRun).order_by(m.PipelineRun.id))
    return [r.PipelineRun.of(row) for row in rows]


def latest_pipeline_run(session: Session) -> Optional[r.PipelineRun]:
    row = session.scalar(select(m.PipelineRun).order_by(m.PipelineRun.id.desc()).limit(1))
    return r.PipelineRun.of(row) if row else None


def stage_runs(session: Session, pipeline_run_id: int) -> list[r.StageRun]:
    rows = session.scalars(select(m.StageRun).where(m.StageRun.pipeline_run_id == pipeline_run_id)
                           .order_by(m.StageRun.started_at, m.StageRun.id))
    return [r.StageRun.of(row) for row in rows]


def checkpoints(session: Session, stage_run_id: int) -> list[r.Checkpoint]:
    stage = stage_of(session, stage_run_id)
    rows = session.scalars(select(m.Checkpoint).where(m.Checkpoint.stage_run_id == stage_run_id)
                           .order_by(m.Checkpoint.step, m.Checkpoint.id))
    return [r.Checkpoint.of(row, stage) for row in rows]


def checkpoint_by_path(session: Session, path: str) -> Optional[r.Checkpoint]:
    row = session.scalar(select(m.Checkpoint).where(m.Checkpoint.path == path)
                         .order_by(m.Checkpoint.id.desc()).limit(1))
    return checkpoint_record(session, row) if row else None


def handoffs(session: Session, pipeline_run_id: int) -> list[r.Handoff]:
    rows = session.scalars(
        select(m.Handoff).join(m.StageRun, m.StageRun.id == m.Handoff.from_stage_run_id)
        .where(m.StageRun.pipeline_run_id == pipeline_run_id).order_by(m.Handoff.id))
    return [handoff_record(session, row) for row in rows]


def handoffs_into(session: Session, stage_run_id: int) -> list[r.Handoff]:
    rows = session.scalars(select(m.Handoff).where(m.Handoff.to_stage_run_id == stage_run_id)
                           .order_by(m.Handoff.id))
    return [handoff_record(session, row) for row in rows]


def events(session: Session, stage_run_id: int) -> list[r.Event]:
    rows = session.scalars(select(m.Event).where(m.Event.stage_run_id == stage_run_id)
                           .order_by(m.Event.created_at, m.Event.id))
    return [r.Event.of(row) for row in rows]


def journal_segments(session: Session, stage_run_id: int) -> list[r.JournalSegment]:
    rows = session.scalars(select(m.JournalSegment)
                           .where(m.JournalSegment.stage_run_id == stage_run_id)
                           .order_by(m.JournalSegment.step_start))
    return [r.JournalSegment.of(row) for row in rows]


def ancestry(session: Session, checkpoint_id: int, url: str) -> list[r.AncestryLink]:
    """The checkpoint, the checkpoint its stage run started from, … back to the first stage.

    A stage run started from a handoff follows the handoff's chosen checkpoint; a resumed
    attempt without a handoff follows the checkpoint it resumed from.
    """
    chain: list[r.AncestryLink] = []
    seen: set[int] = set()
    current: Optional[int] = checkpoint_id
    via = "origin"
    while current is not None and current not in seen:
        seen.add(current)
        ckpt = get(session, m.Checkpoint, current, "checkpoint", url)
        run = session.get(m.StageRun, ckpt.stage_run_id)
        inbound = handoffs_into(session, run.id)
        primary = next((h for h in inbound if h.id == run.handoff_id), None)
        if primary is None and run.handoff_id is not None:
            primary = handoff_record(session, session.get(m.Handoff, run.handoff_id))
        side = tuple(h for h in inbound if primary is None or h.id != primary.id)
        chain.append(r.AncestryLink(checkpoint_record(session, ckpt), r.StageRun.of(run),
                                    primary, side, via))
        if primary is not None:
            current, via = primary.chosen_checkpoint_id, "handoff"
        else:
            current, via = run.resumed_from_checkpoint_id, "resume"
    return chain
