"""The environment every worker process starts with (stage workers, reshard workers, the
built-in model's creator): this process's, plus what DeepSpeed needs on CPU, plus the
kernel pinning of `repro.mode` (core.repro), which must be there before torch loads."""
from __future__ import annotations

import os


def worker_env(repro=None) -> dict:
    """`repro`: a `ReproConfig`; None adds no pinning (tools that only move bytes)."""
    from core.repro import process_env

    env = dict(os.environ)
    try:
        import torch
        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if not has_gpu:
        env.setdefault("DS_ACCELERATOR", "cpu")
    from stages.prebuild import extensions_dir

    # Built once by `make install` (stages.prebuild); private to this environment.
    env.setdefault("TORCH_EXTENSIONS_DIR", extensions_dir())
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Set and dict-of-set iteration order follows the string hash seed; torch.save numbers
    # storages in the order it meets them, so a random seed per process gave the same
    # optimizer state different bytes (and content digest) in two runs of one reshard.
    env.setdefault("PYTHONHASHSEED", "0")
    env.update(process_env(repro) if repro is not None else {})
    return env
