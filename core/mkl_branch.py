"""Which code path MKL really runs, as MKL itself reports it.

`MKL_CBWR` asks MKL for one code path ("branch") on every CPU, but MKL grants a branch
other than COMPATIBLE only on Intel CPUs: on an AMD EPYC, MKL_CBWR=AVX2 leaves MKL on AUTO
(its own dispatch, which differs from Intel's AVX2 branch in the last bits of a matmul).
An environment variable therefore says what was asked, not what ran; this reads what ran
from the MKL that torch carries (statically linked into libtorch_cpu), so a process can
check its pinning and the fingerprint can record it.
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

# MKL's branch codes (its mkl_cbwr constants), as `MKL_VERBOSE` names them.
BRANCH_NAMES = {0: "unset", 1: "OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 8: "SSE4_2",
                10: "AVX2"}
_STRICT = 0x10000  # MKL_CBWR_STRICT, or-ed into the code
_BRANCH_QUERY = -1  # MKL_CBWR_ALL: the branch and the strict flag


def effective_branch() -> str | None:
    """The branch MKL runs in this process ("COMPATIBLE", "AUTO", "AVX2", … with ",STRICT"
    when strict), or None where torch carries no MKL (other BLAS, other architectures)."""
    query = _branch_query()
    if query is None:
        return None
    code = query(_BRANCH_QUERY)
    name = BRANCH_NAMES.get(code & ~_STRICT, f"branch {code & ~_STRICT}")
    return name + (",STRICT" if code & _STRICT else "")


@functools.cache
def _branch_query():
    import torch

    library = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        query = getattr(ctypes.CDLL(str(library)), "mkl_serv_cbwr_get")
    except (OSError, AttributeError):
        return None
    query.restype, query.argtypes = ctypes.c_int, [ctypes.c_int]
    return query
