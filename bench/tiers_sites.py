"""Where the tier bench keeps each tier's copy, and the three things it does to a tier:
place a copy (ckpt.tiers.replicate, as training does after a commit), make a restart's
conditions (disk copies out of the page cache), restore from it alone.

Each tier gets a `TierPlan` that offers only that tier. The run directory is always
offered (ckpt.tiers.restore lists it whatever the plan), but a plan's memory and peer
copies come first; the remote tier's plan has a run directory of its own, left empty.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

from ckpt.tiers.plan import MEMORY, ORDER, PEER, PERSISTENT, REMOTE, TierPlan
from core.errors import BatonError

TIERS = ORDER
DISK_TIERS = (PERSISTENT, REMOTE)
"""Tiers whose copy a restarted node reads from disk, not from memory."""
KEEP = 1


@dataclass
class Restore:
    tier: str | None
    """The tier restore() chose (the bench fails if it is not the one offered)."""
    fetch_verify_s: float
    """ckpt.tiers.restore.restore(): list, fetch a peer or remote copy, verify every checksum."""
    read_s: float
    """Every file of the restored copy read once, checked and deserialized."""

    @property
    def total_s(self) -> float:
        return self.fetch_verify_s + self.read_s


class TierSites:
    def __init__(self, workdir: Path, stage: str, keeper_endpoint: str, memory_dir: str):
        base = TierPlan(workdir / "run", stage, node=0, save_every=1, keep_last=KEEP,
                        memory_dir=memory_dir)
        self.remote_dir = workdir / "remote"
        self.plans = {
            MEMORY: replace(base, memory_every=1, memory_keep=KEEP),
            PEER: replace(base, peer_every=1, peer_keep=KEEP, peer_endpoint=keeper_endpoint),
            PERSISTENT: base,
            REMOTE: replace(base, run_dir=workdir / "remote-only-run",
                            remote_url=self.remote_dir.as_uri()),
        }
        self.staging = base.run_dir / stage / "restored"  # where a resume fetches into

    @property
    def memory_run_dir(self) -> Path:
        """This bench's own directory in the shared tmpfs (`<dir>/baton-tiers-<uid>/<run key>`)."""
        return self.plans[MEMORY].memory_root().parents[2]

    def copy(self, tier: str, source: Path) -> float:
        """Place `source` in `tier` as replicate() does after a save; returns the seconds."""
        from ckpt.tiers.replicate import replicate

        started = time.perf_counter()
        outcome = replicate(self.plans[tier], source, [tier], written_to="bench source")[tier]
        seconds = time.perf_counter() - started
        if not outcome["ok"]:  # a full tmpfs or disk: the machine's limit, not a bug
            raise BatonError(f"bench ckpt --tiers: copying {source.name} to the {tier} tier "
                             f"failed: {outcome['error']}; free space there or use a "
                             "smaller --size-gb")
        return seconds

    def copy_files(self, tier: str, name: str) -> list[Path]:
        """The files of the tier's copy, where it has files on this machine."""
        from bench.page_cache import files_under

        plan = self.plans[tier]
        where = {MEMORY: plan.memory_root() / name, PERSISTENT: plan.persistent_root() / name,
                 REMOTE: self.remote_dir / plan.stage / "checkpoints" / name}.get(tier)
        return files_under(where) if where is not None else []

    def held_bytes(self, tier: str, name: str) -> int:
        """What the tier holds of the copy: file sizes, or the keeper's own count."""
        if tier == PEER:
            from ckpt.tiers.peer import PeerClient

            plan = self.plans[PEER]
            with PeerClient(plan.peer_endpoint, plan.peer_timeout_s) as client:
                return sum(client.committed(plan.peer_scope())[name].values())
        return sum(p.stat().st_size for p in self.copy_files(tier, name))

    def restore(self, tier: str) -> Restore:
        from ckpt.tiers.restore import restore

        started = time.perf_counter()
        restored = restore(self.plans[tier], self.staging)
        fetch_verify_s = time.perf_counter() - started
        if restored.tier != tier:
            raise RuntimeError(f"a plan offering the {tier} tier restored from "
                               f"{restored.tier}: {restored.fell_through}")
        started = time.perf_counter()
        read_all(restored.path)
        read_s = time.perf_counter() - started
        shutil.rmtree(self.staging, ignore_errors=True)  # a fetched copy: not kept
        return Restore(restored.tier, fetch_verify_s, read_s)

    def remove_memory_copies(self) -> None:
        """The tmpfs is shared by everything on the node: leave nothing of this bench."""
        shutil.rmtree(self.memory_run_dir, ignore_errors=True)


def read_all(directory: Path) -> None:
    """What a resume then reads: every file once, checked against the manifest, and
    deserialized from those bytes (torch pickles weights_only; JSON; raw bytes)."""
    from ckpt import manifest as manifest_io
    from ckpt.reader import CheckpointReader
    from ckpt.safe_load import allow_deepspeed_globals

    allow_deepspeed_globals()  # as the checkpoint engine registers it before a load
    reader = CheckpointReader(directory, manifest_io.read(directory))
    for rel in sorted(reader.manifest.files):
        reader.load(rel)
