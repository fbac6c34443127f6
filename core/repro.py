"""`repro.mode`: which CPU kernels a process may use, set before torch loads.

Floating-point results on CPU depend on the kernels torch dispatches to, and those depend
on the instruction set: an AVX512 machine and an AVX2 machine sum in different orders and
differ in the last bits after one step, and over a pipeline the handoffs then choose
different checkpoints. Three libraries choose kernels by ISA, each at its first call:
- MKL (matmul, BLAS, vector math): `MKL_CBWR` is MKL's conditional numerical
  reproducibility. MKL grants its AVX2 branch on Intel CPUs only (on an AMD CPU it runs its
  own dispatch, whose matmuls differ in the last bits); the branch it grants everywhere,
  COMPATIBLE, costs about twice native step time and rounds square roots differently by
  vendor. So portable mode preloads a library that answers MKL's vendor check with "Intel"
  and computes square roots as IEEE ones (core.mkl_preload), pins `avx2` to MKL's AVX2
  branch and `baseline` to COMPATIBLE, and each process checks both (found with `baton
  probe`, docs/reproducibility.md).
- ATen's own vectorized kernels (elementwise, reductions, softmax, Adam): `ATEN_CPU_CAPABILITY`
  selects which build of each kernel runs.
- oneDNN (some convolutions and matmuls): `ONEDNN_MAX_CPU_ISA` caps its JIT kernels.
`repro.isa` names the level ATen and oneDNN are pinned to:
- `avx2` (the default): the AVX2+FMA builds, the same on every x86 CPU that has AVX2
  (Intel since Haswell, AMD since Zen), AVX512 ones included. What it costs against native:
  `baton bench repro` (docs/reproducibility.md has the measurement).
- `baseline`: ATen's `default` build, oneDNN SSE4.1: the same on any x86-64 CPU, about 2x
  slower per step.
Thread counts are fixed too (a parallel reduction's order depends on them), and torch's
deterministic algorithms are on. The variables must be in a process's environment before
torch first dispatches, so the launcher puts them into every worker's and every Ray actor's
environment, and the CLI into its own before it imports torch.

On GPUs the same switch selects deterministic algorithms (`torch.use_deterministic_
algorithms`, `CUBLAS_WORKSPACE_CONFIG`, cuDNN deterministic, TF32 off); docs/reproducibility.md
says what that does and does not cover.
"""
from __future__ import annotations

import os

from core import mkl_preload
from core.errors import BatonError
from core.mkl_branch import effective_branch

PORTABLE, NATIVE = "portable", "native"
# The ISA-pinning variables of each portable level (what they do: the module docstring),
# and the ATen capability a process pinned to that level must report.
LEVELS = {
    "baseline": ({"MKL_CBWR": "COMPATIBLE", "ATEN_CPU_CAPABILITY": "default",
                  "ONEDNN_MAX_CPU_ISA": "SSE41", "DNNL_MAX_CPU_ISA": "SSE41"}, "DEFAULT"),
    "avx2": ({"MKL_CBWR": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
              "ONEDNN_MAX_CPU_ISA": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2"}, "AVX2"),
}
# cuBLAS picks reduction splits by workspace; a fixed workspace makes them deterministic.
GPU_DETERMINISM = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


class MklBranchNotApplied(BatonError):
    def __init__(self, isa: str, found: str):
        wanted = LEVELS[isa][0]["MKL_CBWR"]
        super().__init__(
            f"repro.mode=portable repro.isa={isa}: MKL runs its {found} code path in this process, "
            f"expected {wanted} (MKL_CBWR={wanted}). Either MKL read MKL_CBWR before the portable "
            "settings were in this process's environment, or (on a CPU not made by Intel) MKL's "
            "vendor check was not answered by baton's MKL preload (core/_mkl_preload, loaded before "
            "torch): start the process through `baton`, which sets both up first, or export "
            f"MKL_CBWR={wanted} and LD_PRELOAD=<that library> before it starts.")


class ReproModeNotApplied(BatonError):
    def __init__(self, isa: str, found: str):
        pinned, expected = LEVELS[isa]
        super().__init__(
            f"repro.mode=portable repro.isa={isa}: this process runs ATen's {found} CPU kernels, "
            f"expected {expected}. Either this CPU lacks the instructions the level needs "
            "(repro.isa=baseline runs on any x86-64 CPU), or torch dispatched before the portable "
            "settings were in its environment: start it through `baton`, which sets them first, "
            "or export " + " ".join(f"{k}={v}" for k, v in pinned.items()) + " before it starts.")


def process_env(repro) -> dict[str, str]:
    """The environment variables a process of this mode must start with (empty for native:
    the machine's own defaults stay)."""
    if repro.mode != PORTABLE:
        return {}
    threads = str(repro.threads)
    return {**LEVELS[repro.isa][0], **GPU_DETERMINISM, **{name: threads for name in THREAD_VARIABLES},
            **mkl_preload.preload_env()}


def apply_to_environ(repro) -> None:
    """Put the mode's variables into this process's environment, and the IEEE square root
    into the process itself (both before torch loads)."""
    os.environ.update(process_env(repro))
    if repro.mode == PORTABLE:
        mkl_preload.load_here()


def apply_in_process(repro) -> None:
    """After torch loaded: thread counts and deterministic algorithms, and a check that the
    kernels torch dispatches to are the pinned ones."""
    if repro.mode != PORTABLE:
        return
    import torch

    torch.set_num_threads(repro.threads)
    use_deterministic_algorithms()
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    found = torch.backends.cpu.get_cpu_capability()
    if found != LEVELS[repro.isa][1]:
        raise ReproModeNotApplied(repro.isa, found)
    branch = effective_branch()
    if branch is not None and branch != LEVELS[repro.isa][0]["MKL_CBWR"]:
        raise MklBranchNotApplied(repro.isa, branch)
    if not mkl_preload.in_effect():
        raise mkl_preload.IeeeSqrtNotApplied(
            "the library was not loaded before torch" if mkl_preload.library() else "the library is not built")


def use_deterministic_algorithms() -> None:
    """`torch.use_deterministic_algorithms(True)`, without its import of the compiler
    (`torch._inductor.config`, about 1.2 s of CPU per process: a third of a worker's
    start-up) only to set the compiler's flag. baton never compiles; if anything in the
    process has imported the compiler already, its flag is set as torch would."""
    import sys

    import torch

    inductor = sys.modules.get("torch._inductor.config")
    if inductor is not None:
        inductor.deterministic = True
    torch._C._set_deterministic_algorithms(True, warn_only=False)


def pin_this_process(repro) -> None:
    """For a process that computes with torch itself (the flow: model creation, handoff
    diagnostics): the variables, then the in-process settings and the check."""
    apply_to_environ(repro)
    apply_in_process(repro)


def runs_pinned(repro) -> bool:
    """Whether this process computes under `repro` already: its variables are in the
    environment and ATen dispatches to the level's kernels (always true for native)."""
    wanted = process_env(repro)
    if not wanted:
        return True
    wanted.pop("LD_PRELOAD", None)  # what this process's children get; in_effect checks this one
    if any(os.environ.get(name) != value for name, value in wanted.items()):
        return False
    import torch

    return torch.backends.cpu.get_cpu_capability() == LEVELS[repro.isa][1] and mkl_preload.in_effect()
