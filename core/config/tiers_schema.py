"""`ckpt.tiers.*`: where copies of each checkpoint live besides the run directory.

The run directory is the persistent tier, saved every `stage.save_every` steps and kept
`stage.keep_last` deep, exactly as without tiers; `persistent.url` mirrors it to any
fsspec URL. The memory tier (this node's shared memory) and the peer tier (another
node's keeper process) are faster to restore from and so can be saved more often
(docs/tiers.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class MemoryTierConfig:
    every: int = 0
    """Save a copy in this node's memory every N steps (0: no memory tier)."""
    keep: int = 2
    """Memory-tier copies kept (the newest)."""
    dir: str = "/dev/shm"
    """Where the memory tier lives: a tmpfs, so a node restart wipes it."""


@dataclass
class PeerTierConfig:
    every: int = 0
    """Send a copy to the peer keeper every N steps (0: no peer tier). Each such step must
    also be a memory-tier or run-directory save: the copy is sent from there."""
    keep: int = 2
    """Copies the keeper holds for this stage (the newest)."""
    endpoint: Optional[str] = None
    """host:port of a keeper (`baton ckpt keeper`) on another node; required when every > 0."""
    timeout_s: float = 30.0
    """Per-request timeout; a keeper that does not answer is a recorded fall-through."""


@dataclass
class PersistentTierConfig:
    url: Optional[str] = None
    """An fsspec URL (s3://…, gs://…, file://…) that mirrors every run-directory save;
    null: the run directory only."""


@dataclass
class TiersConfig:
    memory: MemoryTierConfig = field(default_factory=MemoryTierConfig)
    peer: PeerTierConfig = field(default_factory=PeerTierConfig)
    persistent: PersistentTierConfig = field(default_factory=PersistentTierConfig)


@dataclass
class SelectiveConfig:
    threshold: Optional[float] = None
    """Null: every save writes everything. A number: save the model by layer group and
    write a group only when its relative update since its last written version,
    ||w - w_written|| / ||w_written||, exceeds it; the manifest references the older
    file otherwise (docs/tiers.md#selective-persistence). 0: every changed group, so a
    restore is bit-exact. ZeRO 0 only."""
    full_every: int = 10
    """Every N-th save writes every group (bounds how stale a restored layer can be)."""
