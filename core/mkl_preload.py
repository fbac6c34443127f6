"""What portable mode loads ahead of the MKL inside libtorch_cpu (csrc/mkl_preload.c).

Two things MKL decides by the CPU it runs on, which portable mode makes the same on every
x86 CPU with AVX2:

- **Its code path.** `MKL_CBWR=AVX2` asks MKL for its AVX2 branch, but MKL grants it only
  on Intel CPUs; on an AMD EPYC it ran its own dispatch, whose matmuls differ in the last
  bits, and the branch granted everywhere (COMPATIBLE, SSE2 kernels) costs about twice
  native step time. The library answers MKL's vendor check with "Intel", so every CPU runs
  the AVX2 branch; core.mkl_branch reads back the branch MKL really runs, and a pinned
  process that finds another is refused.
- **Its square roots.** ATen hands every float and double `sqrt` (and `pow(x, 0.5)`) to
  MKL's vector math (`vmsSqrt`, `vmdSqrt`). In the COMPATIBLE branch about one result in
  five is off by one unit in the last place, differently on an Intel Xeon and an AMD EPYC
  (found with `baton probe`, docs/reproducibility.md); a step takes square roots in AdamW
  and in the gradient norm DeepSpeed clips by. The library computes them as IEEE square
  roots, which every x86-64 CPU rounds the same, whatever the branch.

libtorch_cpu calls these functions through its symbol table, so the first definition
loaded wins: portable mode puts the library in LD_PRELOAD for the processes it starts and
loads it globally into the current one before torch loads. `in_effect` checks the square
roots on inputs the COMPATIBLE branch rounds wrongly.
"""
from __future__ import annotations

import ctypes
import functools
import os
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

from core.errors import BatonError

IEEE, MKL = "ieee", "mkl vector math"
HERE = Path(__file__).resolve().parent


class IeeeSqrtNotApplied(BatonError):
    def __init__(self, reason: str):
        super().__init__(
            f"repro.mode=portable: square roots in this process still go through MKL's vector "
            f"math, which rounds differently on Intel and AMD CPUs ({reason}). baton loads its MKL "
            "preload (core/_mkl_preload, built from csrc/mkl_preload.c by `make install`) before "
            "torch: reinstall with a C compiler present (`make install`), and start the process "
            "through `baton`, or set LD_PRELOAD to that library before it starts.")


@functools.cache
def library() -> Path | None:
    """The built library (an extension file next to this module), or None if not built."""
    for suffix in EXTENSION_SUFFIXES:
        candidate = HERE / f"_mkl_preload{suffix}"
        if candidate.is_file():
            return candidate
    return None


def preload_env() -> dict[str, str]:
    """LD_PRELOAD for a process started with this environment: the library first, then
    whatever this process preloads already."""
    path = library()
    if path is None:
        return {}
    rest = [p for p in os.environ.get("LD_PRELOAD", "").split() if p and p != str(path)]
    return {"LD_PRELOAD": " ".join([str(path), *rest])}


def load_here() -> None:
    """Load the library globally into this process. Effective only before torch loads;
    `in_effect` tells whether it was."""
    path = library()
    if path is not None and "torch" not in sys.modules:
        ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)


def in_effect() -> bool:
    """Whether torch's CPU square roots are correctly rounded in this process, checked on
    values MKL's COMPATIBLE branch rounds wrongly (a float32 sqrt computed in float64 and
    rounded once is the correctly rounded result)."""
    import torch

    values = torch.arange(1, 4097, dtype=torch.float32) * 0.0137
    return bool(torch.equal(values.sqrt(), values.double().sqrt().float()))


def kind() -> str:
    """What computes square roots in this process, for the fingerprint."""
    return IEEE if in_effect() else MKL
