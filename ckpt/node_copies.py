"""A checkpoint copy per node: the memory tier across nodes (docs/tiers.md).

A node's tmpfs is out of every other node's reach, so a memory-tier save is committed
once per node, into that node's own directory, by the node's leader (its lowest rank).
Each node's copy holds what its own ranks load and nothing else:
- the files every rank reads (DeepSpeed's model-states file at ZeRO 0-2, and baton's
  progress, data, meta, gradient-accumulation and objective records), written by the
  node's leader, because rank 0's copies are on another machine;
- the files of the node's own ranks (RNG, ZeRO optimizer shards, gradient buffers).
Without `zero.elastic_checkpoint` (baton never sets it) a ZeRO-1/2 rank reads only its
own optimizer shard, so such a copy is enough to resume every rank of the node. The
manifest says which node and ranks a copy serves (`extra.node`), and a rank refuses to
load a copy that does not name it.
"""
from __future__ import annotations

from dataclasses import dataclass

NODE = "node"
"""The manifest's `extra` key of a node copy: {"index": k, "ranks": [...]}."""


@dataclass(frozen=True)
class NodeGroup:
    """Which ranks share this rank's node (one all-gather of `parallel.node_rank` at
    start-up: torchrun's c10d rendezvous numbers nodes in the order they joined)."""

    index: int
    ranks: tuple[int, ...]
    count: int

    @property
    def leader(self) -> int:
        return self.ranks[0]

    def record(self) -> dict:
        return {"index": self.index, "ranks": list(self.ranks)}

    @classmethod
    def gather(cls, node_rank: int, nodes: int, world: int) -> "NodeGroup":
        """Collective when nodes > 1: every rank calls it."""
        if nodes <= 1:
            return cls(0, tuple(range(world)), 1)
        import torch.distributed as dist

        node_of: list[int | None] = [None] * world
        dist.all_gather_object(node_of, int(node_rank))
        return cls(int(node_rank), tuple(r for r, k in enumerate(node_of) if k == node_rank),
                   nodes)


def served_ranks(extra: dict) -> list[int] | None:
    """The ranks a node copy serves; None for a whole checkpoint (every rank)."""
    node = extra.get(NODE)
    return None if node is None else [int(r) for r in node["ranks"]]


def serves(extra: dict, rank: int) -> bool:
    ranks = served_ranks(extra)
    return ranks is None or rank in ranks
