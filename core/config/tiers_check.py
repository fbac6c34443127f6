"""Cross-field checks of `ckpt.tiers.*` (collected with every other config problem)."""
from __future__ import annotations

from pathlib import Path


def tier_problems(tiers, save_every: int) -> list[str]:
    found = []
    m, p = tiers.memory, tiers.peer
    for name, tier in (("memory", m), ("peer", p)):
        if tier.every < 0:
            found.append(f"ckpt.tiers.{name}.every={tier.every}: expected >= 0 (0 turns the "
                         f"{name} tier off)")
        if tier.keep < 1:
            found.append(f"ckpt.tiers.{name}.keep={tier.keep}: expected >= 1 copies kept")
    if m.every > 0 and not Path(m.dir).is_dir():
        found.append(f"ckpt.tiers.memory.dir={m.dir!r}: no such directory; expected a tmpfs "
                     "such as /dev/shm")
    if p.every > 0:
        if not p.endpoint or not _endpoint_ok(p.endpoint):
            found.append(f"ckpt.tiers.peer.endpoint={p.endpoint!r}: expected host:port of a "
                         "keeper started with `baton ckpt keeper` on another node")
        sources = [e for e in (m.every, save_every) if e > 0]
        if save_every > 0 and not any(p.every % e == 0 for e in sources):
            found.append(
                f"ckpt.tiers.peer.every={p.every}: each peer copy is sent from a memory-tier "
                f"or run-directory save, so expected a multiple of ckpt.tiers.memory.every="
                f"{m.every} or of stage.save_every={save_every}")
        if p.timeout_s <= 0:
            found.append(f"ckpt.tiers.peer.timeout_s={p.timeout_s}: expected > 0 seconds")
    url = tiers.persistent.url
    if url is not None and "://" not in str(url):
        found.append(f"ckpt.tiers.persistent.url={url!r}: expected an fsspec URL such as "
                     "file:///mnt/ckpt or s3://bucket/prefix (null: the run directory only)")
    return found


def _endpoint_ok(endpoint: str) -> bool:
    host, _, port = str(endpoint).rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


def selective_problems(ckpt, zero_stage: int) -> list[str]:
    sel, found = ckpt.selective, []
    if sel.threshold is None:
        return []
    if sel.threshold < 0:
        found.append(f"ckpt.selective.threshold={sel.threshold}: expected >= 0 (a relative "
                     "update; 0 writes every layer that changed) or null (off)")
    if sel.full_every < 1:
        found.append(f"ckpt.selective.full_every={sel.full_every}: expected >= 1 saves")
    if zero_stage != 0:
        found.append(f"ckpt.selective.threshold with parallel.zero_stage={zero_stage}: selective "
                     "saves split DeepSpeed's ZeRO-0 model-states file by layer; ZeRO 1-3 keep "
                     "optimizer state in flat partitions. Use parallel.zero_stage=0 or "
                     "ckpt.selective.threshold=null")
    return found
