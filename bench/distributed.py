"""One in-process rank (world size 1, gloo) for DeepSpeed, baton and DCP to share.

The stage workers get these variables from their launcher; the bench is its own launcher.
"""
from __future__ import annotations

import atexit
import os
from pathlib import Path

from core.loopback import free_port


def single_rank_environment() -> dict[str, str]:
    """RANK/WORLD_SIZE/... for one local rank. CROSS_* are what DeepSpeed's FastPersist
    writer factory reads to place writers on machines."""
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
            "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_SIZE": "1", "CROSS_RANK": "0",
            "CROSS_SIZE": "1"}


def init_single_rank(parallel_cfg) -> None:
    """Initialise torch.distributed once per process, as a stage worker does
    (stages.engine_setup.init_distributed: one intra-op thread, deterministic kernels)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.update(single_rank_environment())  # a bench is one rank, whatever the shell says
    from core import loopback
    os.environ.update(loopback.listen_environment(loopback.LOOPBACK))  # its store and gloo
    loopback.serve_stores_on(loopback.LOOPBACK)
    from stages.prebuild import extensions_dir
    # The CPU comm op `make install` built, as the stage workers use it: otherwise DeepSpeed
    # JIT-compiles it into the home cache behind a lock file, which a process killed
    # mid-compile leaves behind for every later one to wait on forever.
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", extensions_dir())
    from stages.engine_setup import init_distributed
    init_distributed(parallel_cfg)
    atexit.register(_remove_shm_buffer, os.environ["MASTER_PORT"])


def _remove_shm_buffer(port: str) -> None:
    """DeepSpeed's CPU shared-memory all-reduce leaves its buffer (tens of MB) in /dev/shm,
    named after this rank's master address and port: remove ours when the bench ends."""
    for path in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_127.0.0.1_{port}_*"):
        path.unlink(missing_ok=True)
