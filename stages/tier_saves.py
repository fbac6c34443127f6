"""Which steps a stage saves, and to which checkpoint tiers (ckpt.tiers, docs/tiers.md).

Without tiers: every `stage.save_every` steps and the last, into the run directory.
With tiers: also every memory/peer interval; a step due in the run directory is written
there, any other into this node's memory tier, and the committed save is then copied
to the rest of the tiers it is due in (on rank 0, after the commit, off the training
thread when saves are asynchronous). Across nodes, a memory-tier save is a node copy
(ckpt.node_copies): each node's leader commits its own and sends it to the peer.
"""
from __future__ import annotations

from ckpt.checkpointer import Destination
from ckpt.tiers.plan import MEMORY, PERSISTENT, TierPlan


class TierSaves:
    def __init__(self, cfg):
        self.plan = TierPlan.from_config(cfg)

    def due(self, step: int, final: bool) -> list[str]:
        if not self.plan.enabled:
            return [PERSISTENT] if final or step % self.plan.save_every == 0 else []
        return self.plan.due(step, final)

    def destination(self, due: list[str]) -> Destination | None:
        """None: the run directory, nothing to copy (no tiers configured)."""
        if not self.plan.enabled:
            return None
        written = PERSISTENT if PERSISTENT in due else MEMORY
        root = (self.plan.persistent_root() if written == PERSISTENT
                else self.plan.memory_root())
        keep = self.plan.keep_last if written == PERSISTENT else self.plan.memory_keep

        per_node = written == MEMORY and self.plan.per_node

        def copy_to_other_tiers(final):
            from ckpt.tiers.replicate import replicate
            return replicate(self.plan, final, due, written, node_copy=per_node)

        return Destination(root, keep, copy_to_other_tiers, per_node=per_node)
