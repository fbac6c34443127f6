"""One launcher per node (parallel.nodes > 1): the names each node's launcher uses in the
shared stage directory, and the torchrun arguments of a c10d rendezvous.

Every node runs the same `baton stage NAME parallel.nodes=N parallel.node_rank=K
parallel.rdzv_endpoint=HOST:PORT …`; torchrun's c10d rendezvous (hosted by the agent
whose address is HOST) gathers them, so this is the launcher multi-node users already
run. Node 0's names are the single-node ones, so a one-node run looks as before.
"""
from __future__ import annotations

import hashlib
from pathlib import Path


def node_suffix(parallel) -> str:
    return f"-node-{parallel.node_rank}" if parallel.node_rank else ""


def node_file(directory: Path, name: str, parallel) -> Path:
    """`launch.json` on node 0, `launch-node-K.json` on node K (the same for every file a
    launcher owns: its lock, its launch file, its worker error record and log)."""
    stem, dot, ext = name.partition(".")
    return directory / f"{stem}{node_suffix(parallel)}{dot}{ext}"


def rendezvous_args(parallel, run_dir: str | Path, stage: str) -> list[str]:
    """torchrun arguments: standalone on one node, c10d across nodes. The rendezvous id is
    derived from the run directory and stage, so every node names the same job."""
    per_node = parallel.world_size // parallel.nodes
    if parallel.nodes == 1:
        return ["--standalone", f"--nproc-per-node={per_node}"]
    job = hashlib.sha256(f"{Path(run_dir).resolve()}:{stage}".encode()).hexdigest()[:16]
    return [f"--nnodes={parallel.nodes}", f"--nproc-per-node={per_node}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={parallel.rdzv_endpoint}",
            f"--rdzv-id=baton-{job}", "--max-restarts=0"]
