"""Cross-field checks of a multi-node launch (parallel.nodes, node_rank, rdzv_endpoint)."""
from __future__ import annotations


def node_problems(parallel, tiers, selective=None) -> list[str]:
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
        if tiers.memory.every and selective is not None and selective.threshold is not None:
            # A node copy's layer files would reference only that node's earlier copies:
            # untested, so refused rather than trusted.
            found.append(
                f"ckpt.selective.threshold={selective.threshold} with ckpt.tiers.memory.every="
                f"{tiers.memory.every} and parallel.nodes={p.nodes}: selective saves into "
                "per-node memory-tier copies are not supported yet; drop one of the two "
                "(ckpt.selective.threshold=null, or ckpt.tiers.memory.every=0) (docs/tiers.md)")
    return found
