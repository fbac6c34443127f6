"""Other machines, simulated on this one by capping what its kernel libraries may use.

- SSE_MACHINE: a CPU without AVX2. Whatever this machine has (AVX2 or AVX512), native
  kernels here differ from those, so it tells portable from native everywhere.
- AVX2_MACHINE: a CPU with AVX2 but no AVX512. On an AVX512 machine it differs from
  native; on an AVX2 machine (such as a 2-core AMD EPYC CI box) it is this machine.
- other_vendor_machine(): this CPU as MKL would treat the other vendor's (Intel on an AMD
  machine, AMD on an Intel one). MKL chooses its code paths by vendor as well as by ISA,
  and that is how an AMD EPYC and an Intel Xeon gave different checkpoints in portable
  mode (docs/reproducibility.md); a preloaded library answers MKL's vendor check.
"""
import subprocess
from pathlib import Path

SSE_MACHINE = {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
               "ONEDNN_MAX_CPU_ISA": "SSE41"}
AVX2_MACHINE = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                "ONEDNN_MAX_CPU_ISA": "AVX2"}


def other_vendor_machine(build_dir: Path) -> dict:
    """The environment of a process whose MKL takes the other vendor's code paths."""
    return vendor_machine(build_dir, intel="GenuineIntel" not in Path("/proc/cpuinfo").read_text())


def vendor_machine(build_dir: Path, intel: bool) -> dict:
    """The environment of a process whose MKL believes it runs on an Intel CPU, or not."""
    library = build_dir / f"mkl_vendor_{'intel' if intel else 'other'}.so"
    if not library.exists():
        source = Path(__file__).with_name("mkl_other_vendor.c")
        subprocess.run(["gcc", "-shared", "-fPIC", "-O2", f"-DINTEL={int(intel)}",
                        "-o", str(library), str(source)], check=True)
    return {"LD_PRELOAD": str(library)}
