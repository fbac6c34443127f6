"""Restore from the fastest tier holding a verified copy of the newest checkpoint.

Every tier is asked what it holds; copies are tried newest first and, for one
checkpoint, fastest tier first. A copy is used only once every file's checksum matched
its manifest (and no pickle in it builds anything): a missing, unreachable or corrupt
copy is recorded as a fall-through and the next one is tried. Peer and URL copies are
fetched into `<stage dir>/restored/` and verified there before anything loads them.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from ckpt.layout import committed_steps, position_of
from ckpt.tiers.plan import MEMORY, ORDER, PEER, PERSISTENT, REMOTE, TierPlan
from core.errors import BatonError


@dataclass
class Restored:
    path: Path | None
    tier: str | None
    name: str | None
    fell_through: list[dict] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"path": str(self.path) if self.path else None, "tier": self.tier,
                "name": self.name, "fell_through": self.fell_through,
                "seconds": round(self.seconds, 3)}


def holdings(plan: TierPlan, fell_through: list[dict]) -> list[tuple[str, str]]:
    """(tier, checkpoint name) of every committed copy, newest first, fastest tier first.
    A tier that cannot be asked is recorded in `fell_through`."""
    found: list[tuple[str, str]] = []
    found += [(MEMORY, p.name) for p in committed_steps(plan.memory_root())] if plan.memory_every else []
    if plan.peer_every:
        from ckpt.tiers.peer import PeerClient, PeerUnavailable
        try:
            with PeerClient(plan.peer_endpoint, plan.peer_timeout_s) as client:
                found += [(PEER, n) for n in client.committed(plan.peer_scope())]
        except PeerUnavailable as exc:
            fell_through.append({"tier": PEER, "name": None, "reason": str(exc)})
    found += [(PERSISTENT, p.name) for p in committed_steps(plan.persistent_root())]
    if plan.remote_url:
        from ckpt.tiers.remote import RemoteUnavailable, committed
        try:
            found += [(REMOTE, n) for n in committed(plan.remote_root())]
        except RemoteUnavailable as exc:
            fell_through.append({"tier": REMOTE, "name": None, "reason": str(exc)})
    return sorted(found, key=lambda c: (tuple(-x for x in position_of(c[1])), ORDER.index(c[0])))


def restore(plan: TierPlan, staging: Path) -> Restored:
    started, fell_through = time.perf_counter(), []
    for tier, name in holdings(plan, fell_through):
        try:
            path = _local_copy(plan, tier, name, staging)
            _verify(path)
        except (BatonError, OSError) as exc:
            fell_through.append({"tier": tier, "name": name, "reason": _reason(exc)})
            continue
        return Restored(path, tier, name, fell_through, time.perf_counter() - started)
    return Restored(None, None, None, fell_through, time.perf_counter() - started)


def _local_copy(plan: TierPlan, tier: str, name: str, staging: Path) -> Path:
    if tier == MEMORY:
        return plan.memory_root() / name
    if tier == PERSISTENT:
        return plan.persistent_root() / name
    into = staging / f"{tier}-{name}"
    shutil.rmtree(staging, ignore_errors=True)  # one restored copy at a time
    into.mkdir(parents=True)
    if tier == PEER:
        from ckpt.tiers.peer import PeerClient
        with PeerClient(plan.peer_endpoint, plan.peer_timeout_s) as client:
            rels = client.committed(plan.peer_scope()).get(name)
            if rels is None:
                raise FileNotFoundError(f"the keeper no longer holds {name}")
            client.fetch(plan.peer_scope(), name, sorted(rels), into)
    else:
        from ckpt.tiers.remote import fetch
        fetch(plan.remote_root(), name, into)
    return into


def _verify(path: Path) -> None:
    from ckpt.manifest import verify
    verify(path)  # sizes, every checksum, no pickle that builds anything


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return " ".join(line.strip() for line in text[:6]) or type(exc).__name__
