"""What a stage worker imports before it computes anything, loaded once and shared.

A worker's first seconds are imports: DeepSpeed and torch (about 2 s of CPU here), then
the model family's transformers modules, which transformers loads lazily when the worker
first names its class (another 1.5–2 s). A process that has loaded all of it can fork
workers that start computing at once: `stages.fork_agent` does so for the ranks of one
launch, `stages.zygote` for every launch of a test session or a pipeline.

Loading must start no thread and run no torch operation, so that forking afterwards
copies no half-held lock and no thread pool; `thread_count` lets a forking process check.
"""
from __future__ import annotations

import importlib
import os
import sys

WORKER_MODULES = ("stages.worker", "stages.reshard_worker")
# The model families baton trains (docs/own_data.md); another family's modules are
# imported by its workers as before.
MODEL_MODULES = (
    "transformers.models.auto.configuration_auto",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto",
    "transformers.tokenization_utils_tokenizers",
    "transformers.models.llama.modeling_llama",
    "transformers.models.qwen2.modeling_qwen2",
)


def load(modules: tuple[str, ...] = WORKER_MODULES) -> None:
    """DeepSpeed (without its mlflow import, as stages.lean_start), stores bound where the
    launch listens (core.loopback), then `modules` and the model families' modules."""
    from core import loopback
    from stages.lean_start import hidden

    with hidden("mlflow"):
        import deepspeed  # noqa: F401
    address = loopback.wanted()
    if address:
        loopback.serve_stores_on(address)
    for name in (*modules, *MODEL_MODULES):
        try:
            importlib.import_module(name)
        except ImportError:  # an older or newer transformers without this family
            if not name.startswith("transformers."):
                raise
    for library in ("ray", "prefect"):  # their variables are not in a fork server's fingerprint
        if library in sys.modules:
            raise RuntimeError(f"the warm image imported {library}; stages.fork_server."
                               "VOLATILE_PREFIXES leaves its variables out of the fingerprint "
                               "on the ground that it does not")


def thread_count() -> int:
    """Threads of this process (1: safe to fork)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading
        return threading.active_count()
