"""Studies in the lineage store: the verbs `LineageStore` inherits from `StudyVerbs`.

A selection study takes K checkpoints of one stage run (SFT), computes pre-RL
diagnostics for each, runs a short RL from each and correlates the diagnostics with
the RL outcome; its winner is the diagnostic (and direction) that predicted the
outcome best. `latest_study` is what a later handoff asks for that winner.
"""
from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from lineage import models as m
from lineage import queries as q
from lineage import records as r
from lineage.errors import InvalidValue, LineageConflict, UnknownRecord
from lineage.urls import normalize_path

OUTCOME_KEYS = ("start_reward", "final_reward", "gain")
FINISHED = ("completed", "failed")
DIRECTIONS = (1, -1)
MAX_DIAGNOSTIC = 50  # studies.winner_diagnostic is a String(50)
CANDIDATE_HINT = "record it first with record_study_candidate(study_id, checkpoint_id, …)"


def _check_choice(key: str, value: Any, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise InvalidValue(key, value, "one of " + ", ".join(allowed))


def json_safe(value: Any) -> Any:
    """`value` with every NaN or infinity as None: PostgreSQL's JSON has no NaN, and an
    undefined correlation (constant inputs) is one."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def _check_outcome(outcome: Optional[Mapping[str, Any]]) -> Optional[dict]:
    if outcome is None:
        return None
    missing = [k for k in OUTCOME_KEYS if k not in outcome]
    if missing:
        raise InvalidValue("outcome", dict(outcome),
                           "a mapping with " + ", ".join(OUTCOME_KEYS) + " (missing "
                           + ", ".join(missing) + ")")
    return json_safe(outcome)


def _check_winner(diagnostic: Optional[str], direction: Optional[int]) -> None:
    if direction is not None and (isinstance(direction, bool) or direction not in DIRECTIONS):
        raise InvalidValue("winner_direction", direction,
                           "+1 (higher is better) or -1 (lower is better)")
    if diagnostic is not None and len(diagnostic) > MAX_DIAGNOSTIC:
        raise InvalidValue("winner_diagnostic", diagnostic, f"at most {MAX_DIAGNOSTIC} characters")
    if diagnostic is not None and direction is None:
        raise InvalidValue("winner_direction", None, f"+1 or -1 with winner_diagnostic={diagnostic!r}")
    if diagnostic is None and direction is not None:
        raise InvalidValue("winner_diagnostic", None,
                           f"the diagnostic that winner_direction={direction} ranks by")


def _candidate(session: Session, study_id: int, checkpoint_id: int) -> Optional[m.StudyCandidate]:
    return session.scalar(select(m.StudyCandidate).where(
        m.StudyCandidate.study_id == study_id, m.StudyCandidate.checkpoint_id == checkpoint_id))


def _running(row: m.Study) -> m.Study:
    """A finished study is a record of what happened: its candidates no longer change."""
    if row.status != "running":
        raise LineageConflict(
            f"study {row.id} is {row.status}; candidates and outcomes are recorded while a study "
            "is running: start a new study with start_study")
    return row


def latest(session: Session, kind: str, from_stage_run_id: Optional[int]) -> Optional[r.Study]:
    """The newest completed study of `kind` that named a winner."""
    query = select(m.Study).where(m.Study.kind == kind, m.Study.status == "completed",
                                  m.Study.winner_diagnostic.is_not(None))
    if from_stage_run_id is not None:
        query = query.where(m.Study.from_stage_run_id == from_stage_run_id)
    row = session.scalar(query.order_by(m.Study.id.desc()).limit(1))
    return r.Study.of(row) if row else None


class StudyVerbs:
    """Study verbs of `LineageStore`; each write is one transaction through its `_write`."""

    url: str
    _write: Callable[[Callable[[Session], Any]], Any]
    _read: Callable[[Callable[[Session], Any]], Any]

    def start_study(self, kind: str, from_stage_run_id: int,
                    config: Mapping[str, Any]) -> r.Study:
        """A `running` study over checkpoints of `from_stage_run_id`."""
        _check_choice("kind", kind, m.STUDY_KINDS)

        def write(s: Session) -> r.Study:
            q.get(s, m.StageRun, from_stage_run_id, "stage run", self.url)
            row = m.Study(kind=kind, from_stage_run_id=from_stage_run_id, status="running",
                          config=json_safe(config), created_at=m.utcnow())
            s.add(row)
            s.flush()
            return r.Study.of(row)
        return self._write(write)

    def record_study_candidate(self, study_id: int, checkpoint_id: int, step: int,
                               diagnostics: Mapping[str, Any],
                               outcome: Optional[Mapping[str, Any]] = None,
                               rl_run_dir: Optional[str | Path] = None) -> r.StudyCandidate:
        """One checkpoint of a running study with its diagnostics (and outcome, if known)."""
        checked = _check_outcome(outcome)

        def write(s: Session) -> r.StudyCandidate:
            _running(q.get(s, m.Study, study_id, "study", self.url))
            q.get(s, m.Checkpoint, checkpoint_id, "checkpoint", self.url)
            if _candidate(s, study_id, checkpoint_id) is not None:
                raise LineageConflict(
                    f"checkpoint {checkpoint_id} is already a candidate of study {study_id}; "
                    "set its outcome with set_study_candidate_outcome")
            row = m.StudyCandidate(
                study_id=study_id, checkpoint_id=checkpoint_id, step=step,
                diagnostics=json_safe(diagnostics), outcome=checked,
                rl_run_dir=normalize_path(rl_run_dir) if rl_run_dir is not None else None)
            s.add(row)
            s.flush()
            return r.StudyCandidate.of(row)
        return self._write(write)

    def set_study_candidate_outcome(self, study_id: int, checkpoint_id: int,
                                    outcome: Mapping[str, Any],
                                    rl_run_dir: Optional[str | Path] = None) -> r.StudyCandidate:
        """The short RL from a candidate finished: its rewards, and where it ran."""
        checked = _check_outcome(outcome)

        def write(s: Session) -> r.StudyCandidate:
            _running(q.get(s, m.Study, study_id, "study", self.url))
            row = _candidate(s, study_id, checkpoint_id)
            if row is None:
                raise UnknownRecord("study candidate", (study_id, checkpoint_id), self.url,
                                    CANDIDATE_HINT)
            row.outcome = checked
            if rl_run_dir is not None:
                row.rl_run_dir = normalize_path(rl_run_dir)
            return r.StudyCandidate.of(row)
        return self._write(write)

    def finish_study(self, study_id: int, status: str, *,
                     results: Optional[Mapping[str, Any]] = None,
                     winner_diagnostic: Optional[str] = None,
                     winner_direction: Optional[int] = None,
                     verdict: Optional[str] = None,
                     ended_at: Optional[datetime] = None) -> r.Study:
        """Close a running study with its analysis; only a `completed` one with a winner
        is what `latest_study` hands on."""
        _check_choice("status", status, FINISHED)
        _check_winner(winner_diagnostic, winner_direction)

        def write(s: Session) -> r.Study:
            row = q.get(s, m.Study, study_id, "study", self.url)
            if row.status != "running":
                raise LineageConflict(f"study {study_id} is already {row.status}; "
                                      "start a new study with start_study")
            row.status, row.ended_at = status, ended_at or m.utcnow()
            row.results = json_safe(results) if results is not None else None
            row.winner_diagnostic = winner_diagnostic
            # int(): a numpy integer from the analysis is not something every driver binds.
            row.winner_direction = None if winner_direction is None else int(winner_direction)
            row.verdict = verdict
            return r.Study.of(row)
        return self._write(write)

    def set_study_mlflow(self, study_id: int, run_id: str,
                         candidate_run_ids: Mapping[int, str]) -> r.Study:
        """The study's MLflow run and each candidate's child run (keys: checkpoint ids)."""
        def write(s: Session) -> r.Study:
            row = q.get(s, m.Study, study_id, "study", self.url)
            row.mlflow_run_id = run_id
            for checkpoint_id, child in candidate_run_ids.items():
                candidate = _candidate(s, study_id, checkpoint_id)
                if candidate is None:
                    raise UnknownRecord("study candidate", (study_id, checkpoint_id), self.url,
                                        CANDIDATE_HINT)
                candidate.mlflow_run_id = child
            s.flush()
            return r.Study.of(row)
        return self._write(write)

    def study(self, study_id: int) -> r.Study:
        return self._read(lambda s: r.Study.of(q.get(s, m.Study, study_id, "study", self.url)))

    def studies(self, kind: Optional[str] = None) -> list[r.Study]:
        """Every study (of `kind`), newest first."""
        if kind is not None:
            _check_choice("kind", kind, m.STUDY_KINDS)

        def read(s: Session) -> list[r.Study]:
            query = select(m.Study).order_by(m.Study.id.desc())
            if kind is not None:
                query = query.where(m.Study.kind == kind)
            return [r.Study.of(row) for row in s.scalars(query)]
        return self._read(read)

    def latest_study(self, kind: str = "selection",
                     from_stage_run_id: Optional[int] = None) -> Optional[r.Study]:
        """The newest completed study of `kind` with a winner (over `from_stage_run_id`'s
        checkpoints, when given); None when there is none."""
        _check_choice("kind", kind, m.STUDY_KINDS)
        return self._read(lambda s: latest(s, kind, from_stage_run_id))
