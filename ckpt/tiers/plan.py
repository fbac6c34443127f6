"""Which tiers a step's save goes to, and where each tier keeps this stage's copies.

The run directory is the persistent tier (every `stage.save_every`, `stage.keep_last`
deep); a step due there is written there first, because handoffs and lineage read it.
A step due only for the memory or peer tier is written to this node's memory tier.
Every other due tier gets a copy of the committed checkpoint (ckpt.tiers.replicate).
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

MEMORY, PEER, PERSISTENT, REMOTE = "memory", "peer", "persistent", "remote"
ORDER = (MEMORY, PEER, PERSISTENT, REMOTE)
"""Fastest first: the order restore tries them in."""


def run_key(run_dir: str | Path) -> str:
    """A stable name for a run directory inside shared places (a tmpfs, a keeper)."""
    return hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class TierPlan:
    run_dir: Path
    stage: str
    node: int
    save_every: int
    keep_last: int
    memory_every: int = 0
    memory_keep: int = 2
    memory_dir: str = "/dev/shm"
    peer_every: int = 0
    peer_keep: int = 2
    peer_endpoint: str | None = None
    peer_timeout_s: float = 30.0
    remote_url: str | None = None
    nodes: int = 1

    @classmethod
    def from_config(cls, cfg, node: int | None = None) -> "TierPlan":
        t = cfg.ckpt.tiers
        if node is None:
            node = cfg.parallel.node_rank
        return cls(Path(cfg.run.dir).resolve(), cfg.stage.name, node, cfg.stage.save_every,
                   cfg.stage.keep_last, t.memory.every, t.memory.keep, t.memory.dir,
                   t.peer.every, t.peer.keep, t.peer.endpoint, t.peer.timeout_s,
                   t.persistent.url, int(cfg.parallel.nodes))

    @property
    def per_node(self) -> bool:
        """Memory-tier saves are node copies (ckpt.node_copies): one per node, each in that
        node's tmpfs, and their peer copies kept per node too."""
        return self.nodes > 1

    @property
    def enabled(self) -> bool:
        return bool(self.memory_every or self.peer_every or self.remote_url)

    def due(self, step: int, final: bool = False) -> list[str]:
        """The tiers this step is saved to, fastest first. `final`: the last step of the
        stage or a preemption, which always reaches the run directory."""
        due = []
        if self.memory_every and step % self.memory_every == 0:
            due.append(MEMORY)
        if self.peer_every and step % self.peer_every == 0:
            due.append(PEER)
        if final or step % self.save_every == 0:
            due.append(PERSISTENT)
            if self.remote_url:
                due.append(REMOTE)
        return due

    def memory_root(self, node: int | None = None) -> Path:
        """This node's memory-tier checkpoints directory for the stage."""
        node = self.node if node is None else node
        return (Path(self.memory_dir) / f"baton-tiers-{os.getuid()}" / run_key(self.run_dir)
                / f"node-{node}" / self.stage / "checkpoints")

    def peer_scope(self, node_copy: bool = False) -> str:
        """Whole checkpoints, sent by rank 0 from a committed run-directory or single-node
        copy, are under one name every node's launcher finds; a node copy under its node's
        own (`<...>/node-<k>`), sent by that node's leader."""
        whole = f"{run_key(self.run_dir)}/{self.stage}"
        return f"{whole}/node-{self.node}" if node_copy else whole

    def remote_root(self) -> str | None:
        return f"{self.remote_url.rstrip('/')}/{self.stage}/checkpoints" if self.remote_url else None

    def persistent_root(self) -> Path:
        return self.run_dir / self.stage / "checkpoints"
