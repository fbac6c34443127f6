"""Restore from the fastest tier holding a verified copy of the newest checkpoint.

Every tier is asked what it holds; copies are tried newest first and, for one
checkpoint, fastest tier first. A copy is used only once every file's checksum matched
its manifest (and no pickle in it builds anything): a missing, unreachable or corrupt
copy is recorded as a fall-through and the next one is tried. Peer and URL copies are
fetched into `<stage dir>/restored/` and verified there before anything loads them.

Across nodes, a memory-tier copy (and its peer copy) holds one node's ranks only
(ckpt.node_copies). A launcher restores before its ranks are known, so the workers then
agree on one step every rank can load (stages.tier_restore.agree_across_nodes), asking
again with `rank` and `not_after` set.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from ckpt.layout import committed_steps, position_of
from ckpt.node_copies import NODE, served_ranks, serves
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
                found += [(PEER, n) for scope in peer_scopes(plan) for n in client.committed(scope)]
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


def peer_scopes(plan: TierPlan) -> list[str]:
    """Where the keeper holds this node's copies: node copies, then whole checkpoints (a
    step is one or the other: written to the memory tier or to the run directory)."""
    return [plan.peer_scope(node_copy=True), plan.peer_scope()] if plan.per_node else [plan.peer_scope()]


def restore(plan: TierPlan, staging: Path, rank: int | None = None,
            not_after: str | None = None, before: str | None = None) -> Restored:
    """`rank`: use only copies that hold this rank's files (a node copy holds its node's
    ranks'); `not_after`: only checkpoints no newer than this name; `before`: only
    checkpoints older than this name."""
    started, fell_through = time.perf_counter(), []
    for tier, name in holdings(plan, fell_through):
        if not _in_bounds(position_of(name), not_after, before):
            continue
        try:
            path = _local_copy(plan, tier, name, staging)
            manifest = _verify(path)
        except (BatonError, OSError) as exc:
            fell_through.append({"tier": tier, "name": name, "reason": _reason(exc)})
            continue
        if rank is not None and not serves(manifest.extra, rank):
            fell_through.append({"tier": tier, "name": name, "reason": (
                f"a copy of node {manifest.extra[NODE]['index']}'s ranks "
                f"{served_ranks(manifest.extra)}, not of rank {rank}")})
            continue
        return Restored(path, tier, name, fell_through, time.perf_counter() - started)
    return Restored(None, None, None, fell_through, time.perf_counter() - started)


def _in_bounds(position: tuple[int, int], not_after: str | None, before: str | None) -> bool:
    if not_after is not None and position > position_of(not_after):
        return False
    return before is None or position < position_of(before)


def checkpoint_name(path: Path) -> str:
    """The checkpoint a restored directory holds: its own name, or for a fetched copy
    (`<staging>/<tier>-<name>`, `_local_copy`) the part after the tier."""
    path = Path(path)
    if position_of(path.name) is not None:
        return path.name
    return path.name.partition("-")[2]


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
            for scope in peer_scopes(plan):
                rels = client.committed(scope).get(name)
                if rels is not None:
                    break
            else:
                raise FileNotFoundError(f"the keeper no longer holds {name}")
            client.fetch(scope, name, sorted(rels), into)
    else:
        from ckpt.tiers.remote import fetch
        fetch(plan.remote_root(), name, into)
    return into


def _verify(path: Path):
    from ckpt.manifest import verify
    return verify(path)  # sizes, every checksum, no pickle that builds anything


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return " ".join(line.strip() for line in text[:6]) or type(exc).__name__
