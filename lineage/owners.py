"""Crash bookkeeping: runs left `running` by a process that is gone are marked `crashed`.

Every pipeline run and stage run records its owner: the host, the pid and the pid's
start time (clock ticks after boot, so that a reused pid is not taken for the owner)
of the process that runs it. Whenever the store is opened (`LineageStore.open`), rows
still `running` whose owner is on this host and no longer alive are marked `crashed`,
with a `crashed` event for stage runs: a `baton run` killed hard does not leave its
runs `running` forever.

Rows owned by another host are left alone: from here nothing tells a dead process on
another machine from a live one. That would need a heartbeat (the owner refreshing a
timestamp, everyone else declaring it dead after a timeout), which baton does not
keep; such rows are marked when the store is next opened on their own host. Rows
without an owner (written before schema revision 0002) are left alone too.
"""
from __future__ import annotations

from typing import Optional

from sqlalchemy import select
from sqlalchemy.orm import Session

from core import processes
from lineage import models as m

CRASHED = "crashed"
_OWNED = ((m.PipelineRun, "pipeline run"), (m.StageRun, "stage run"))


def owner_columns(owner: Optional[processes.ProcessIdentity] = None) -> dict:
    """The owner columns of a new row: `owner`, or else this process."""
    owner = owner or processes.current()
    return {"owner_host": owner.host, "owner_pid": owner.pid, "owner_pid_start": owner.start_ticks}


def _orphaned(session: Session, model) -> list:
    rows = session.scalars(select(model).where(
        model.status == "running", model.owner_host == processes.hostname(),
        model.owner_pid.is_not(None))).all()
    return [row for row in rows if not processes.ProcessIdentity(
        row.owner_host, row.owner_pid, row.owner_pid_start).alive()]


def any_orphaned(session: Session) -> bool:
    """Read-only check, so that opening a healthy store never takes a write lock."""
    return any(_orphaned(session, model) for model, _ in _OWNED)


def mark_crashed(session: Session) -> list[tuple[str, int]]:
    """Mark this host's `running` rows whose owner is gone; return (kind, id) of each."""
    now, marked = m.utcnow(), []
    for model, kind in _OWNED:
        for row in _orphaned(session, model):
            row.status, row.ended_at = CRASHED, now
            if model is m.StageRun:
                session.add(m.Event(
                    stage_run_id=row.id, role="lineage", kind=CRASHED, step=None,
                    created_at=now, detail={
                        "owner_host": row.owner_host, "owner_pid": row.owner_pid,
                        "owner_pid_start": row.owner_pid_start,
                        "reason": "its owner process is no longer running; found when the "
                                  f"store was opened by pid {processes.current().pid}"}))
            marked.append((kind, row.id))
    return marked
