"""`python -m stages.prebuild`: compile DeepSpeed's CPU shared-memory comm op once, at install.

DeepSpeed JIT-compiles this op on first use in every worker, guarded by a lock file;
a worker killed mid-compile leaves the lock behind and every later worker waits on it
forever. Building it once, serially, into the virtual environment's own extensions
directory (see `stages.worker_env`) takes the compile out of training runs.
"""
from __future__ import annotations

import os
import sys


def extensions_dir() -> str:
    return os.path.join(sys.prefix, "torch_extensions")


def main() -> int:
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", extensions_dir())
    import torch

    if torch.cuda.is_available():
        return 0  # NCCL on GPUs: the CPU comm op is not used
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.comm.torch import build_shm_op

    build_shm_op()
    return 0


if __name__ == "__main__":
    sys.exit(main())
