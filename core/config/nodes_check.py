"""Cross-field checks of a multi-node launch (parallel.nodes, node_rank, rdzv_endpoint)."""
from __future__ import annotations


def node_problems(parallel, tiers) -> list[str]:
    p, found = parallel, []
    if p.nodes < 1:
        return [f"parallel.nodes={p.nodes}: expected >= 1 machines"]
    if not 0 <= p.node_rank < p.nodes:
        found.append(f"parallel.node_rank={p.node_rank}: expected 0..{p.nodes - 1} "
                     f"(parallel.nodes={p.nodes})")
    if p.world_size >= 1 and p.world_size % p.nodes:
        found.append(f"parallel.world_size={p.world_size} does not split evenly over "
                     f"parallel.nodes={p.nodes}; expected a multiple of {p.nodes} (ranks per "
                     "node times nodes)")
    if p.nodes > 1:
        host, _, port = str(p.rdzv_endpoint or "").rpartition(":")
        if not host or not port.isdigit():
            found.append(f"parallel.rdzv_endpoint={p.rdzv_endpoint!r}: expected host:port of "
                         "the c10d rendezvous, the same on every node (e.g. node 0's "
                         "address and a free port) when parallel.nodes > 1")
        if tiers.memory.every:
            found.append(
                f"ckpt.tiers.memory.every={tiers.memory.every} with parallel.nodes={p.nodes}: "
                "the memory tier is single-node for now (a node's copy would hold only its "
                "own ranks' files); use the peer and persistent tiers across nodes "
                "(docs/tiers.md)")
    return found
