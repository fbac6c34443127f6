"""After a save commits: copy it to every other tier it is due in. A tier that fails (a
full tmpfs, an unreachable keeper or URL) is recorded as a fall-through and logged; the
save itself stands, and every tier's `latest` stays at its previous copy."""
from __future__ import annotations

import logging
import time
from pathlib import Path

from ckpt.tiers.plan import MEMORY, PEER, PERSISTENT, REMOTE, TierPlan

log = logging.getLogger(__name__)


def replicate(plan: TierPlan, final: Path, due: list[str], written_to: str,
              node_copy: bool = False) -> dict[str, dict]:
    """`node_copy`: `final` is this node's copy (ckpt.node_copies), sent to the peer under
    this node's own scope. It is only ever a memory-tier save, due at most in the peer."""
    placement = {written_to: {"ok": True, "where": str(final)}}
    for tier in due:
        if tier == written_to:
            continue
        started = time.perf_counter()
        try:
            where = _copy(plan, final, tier, node_copy)
            placement[tier] = {"ok": True, "where": where,
                               "seconds": round(time.perf_counter() - started, 3)}
        except OSError as exc:
            placement[tier] = {"ok": False, "error": str(exc)}
            log.warning("checkpoint %s has no %s-tier copy: %s", final.name, tier, exc)
    return placement


def _copy(plan: TierPlan, final: Path, tier: str, node_copy: bool) -> str:
    if tier == MEMORY:
        from ckpt.tiers.local_copy import copy_committed
        return str(copy_committed(final, plan.memory_root(), plan.memory_keep))
    if tier == PEER:
        from ckpt.tiers.peer import PeerClient
        scope = plan.peer_scope(node_copy)
        with PeerClient(plan.peer_endpoint, plan.peer_timeout_s) as client:
            client.send_checkpoint(scope, final, plan.peer_keep)
        return f"{plan.peer_endpoint}/{scope}/{final.name}"
    if tier == REMOTE:
        from ckpt.tiers.remote import upload
        upload(final, plan.remote_root(), plan.keep_last)
        return f"{plan.remote_root()}/{final.name}"
    if tier == PERSISTENT:
        from ckpt.tiers.local_copy import copy_committed
        return str(copy_committed(final, plan.persistent_root(), plan.keep_last))
    raise ValueError(f"unknown tier {tier!r}")
