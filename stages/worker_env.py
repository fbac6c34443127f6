"""The environment every worker process starts with (stage workers, reshard workers, the
built-in model's creator): this process's, plus what DeepSpeed needs on CPU, plus the
kernel pinning of `repro.mode` (core.repro), which must be there before torch loads."""
from __future__ import annotations

import glob
import importlib.util
import os
import re
import sys
from pathlib import Path

GPU_DEVICES = ("/dev/nvidia[0-9]*", "/dev/kfd")


def worker_env(repro=None) -> dict:
    """`repro`: a `ReproConfig`; None adds no pinning (tools that only move bytes)."""
    return {**os.environ, **worker_variables(repro)}


def worker_variables(repro=None) -> dict:
    """What `worker_env` sets on top of this process's environment (each default kept where
    this process has its own value), and the kernel pins of `repro`."""
    from core.repro import process_env
    from stages.prebuild import extensions_dir

    defaults = {
        # Built once by `make install` (stages.prebuild); private to this environment.
        "TORCH_EXTENSIONS_DIR": extensions_dir(),
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        # Set and dict-of-set iteration order follows the string hash seed; torch.save numbers
        # storages in the order it meets them, so a random seed per process gave the same
        # optimizer state different bytes (and content digest) in two runs of one reshard.
        "PYTHONHASHSEED": "0",
    }
    if not has_gpu():
        defaults["DS_ACCELERATOR"] = "cpu"
    variables = {name: os.environ.get(name, value) for name, value in defaults.items()}
    variables.update(process_env(repro) if repro is not None else {})
    return variables


def has_gpu() -> bool:
    """Whether torch can use a GPU here. A launcher computes nothing, and importing torch
    only to ask would cost every launch about a second of CPU, so without torch loaded the
    answer is read off its build (torch/version.py: a CUDA or ROCm version) and the
    machine's GPU device nodes. A wrong "yes" is harmless: DeepSpeed then picks its
    accelerator itself, and falls back to the CPU."""
    if "torch" in sys.modules:
        return sys.modules["torch"].cuda.is_available()
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return False
    version = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    built = version.read_text() if version.is_file() else ""
    return built_for_gpu(built) and any(glob.glob(pattern) for pattern in GPU_DEVICES)


def built_for_gpu(version_py: str) -> bool:
    """torch/version.py names a CUDA or ROCm (hip) version: `cuda: Optional[str] = '12.4'`."""
    return re.search(r"^(cuda|hip)\b[^=\n]*=\s*['\"]", version_py, re.MULTILINE) is not None
