"""`python -m stages.lean_start MODULE ARGS...`: run MODULE as `__main__`, with DeepSpeed
imported first while MLflow is hidden from it.

DeepSpeed's autotuner (`deepspeed.autotuning.autotuner`, imported by every `import
deepspeed`) imports mlflow when it is installed, for an autotuning feature baton never
uses. That import is about 40% of DeepSpeed's and costs every worker process about a
second of CPU at start-up; a pipeline starts hundreds of them. A worker never logs to
MLflow (the flow does), and once DeepSpeed is imported mlflow is importable again, so
nothing else in the process notices.
"""
from __future__ import annotations

import runpy
import sys
from contextlib import contextmanager


@contextmanager
def hidden(module: str):
    """`import module` raises ImportError inside the block (a None entry in sys.modules is
    Python's own "not importable" marker); afterwards the module imports as usual."""
    if module in sys.modules:  # already imported: nothing to hide, nothing to restore
        yield
        return
    sys.modules[module] = None
    try:
        yield
    finally:
        if sys.modules.get(module, ...) is None:
            del sys.modules[module]


def main(argv: list[str]) -> None:
    with hidden("mlflow"):
        import deepspeed  # noqa: F401  (imported for its side effect: no mlflow inside)
    from core import loopback
    address = loopback.wanted()
    if address:  # any store a worker hosts listens where the launch listens
        loopback.serve_stores_on(address)
    module, sys.argv = argv[0], argv
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
