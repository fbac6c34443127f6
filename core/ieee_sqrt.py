"""IEEE square roots in place of MKL's vector-math ones, for portable mode.

ATen hands every float and double `sqrt` on the CPU (and `pow(x, 0.5)`) to MKL's vector
math (`vmsSqrt`, `vmdSqrt`), statically linked into libtorch_cpu. MKL's COMPATIBLE branch,
the one branch it grants on both Intel and AMD CPUs, computes them with an approximation
that is off by one unit in the last place for about one result in five, and which results
are off differs between an Intel Xeon and an AMD EPYC. A training step takes square roots
in the optimizer (unfused AdamW) and in the gradient norm DeepSpeed clips by, so one step
differs in the last bits and the whole pipeline after it (found with `baton probe`,
docs/reproducibility.md).

csrc/ieee_sqrt.c defines both functions as IEEE square roots, which every x86-64 CPU
rounds the same. Portable mode puts that library ahead of libtorch_cpu in every process:
LD_PRELOAD for the processes it starts, and a global dlopen before torch loads for the
current one (libtorch_cpu's calls go through its symbol table, and the first definition
loaded wins). `in_effect` checks that it did, on inputs MKL's COMPATIBLE branch rounds
wrongly.
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
            f"math, which rounds differently on Intel and AMD CPUs ({reason}). baton loads its IEEE "
            "square root (core/_ieee_sqrt, built from csrc/ieee_sqrt.c by `make install`) before "
            "torch: reinstall with a C compiler present (`make install`), and start the process "
            "through `baton`, or set LD_PRELOAD to that library before it starts.")


@functools.cache
def library() -> Path | None:
    """The built library (an extension file next to this module), or None if not built."""
    for suffix in EXTENSION_SUFFIXES:
        candidate = HERE / f"_ieee_sqrt{suffix}"
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
