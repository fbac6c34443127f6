"""How many of torch's float square roots are wrongly rounded, under each MKL branch.

ATen hands float `sqrt` (and `pow(x, 0.5)`) to MKL's vector math. This counts, on 65,536
values, the results that differ from the correctly rounded one (float64, rounded once),
for each `MKL_CBWR` value given. Each branch runs in a fresh process (MKL reads MKL_CBWR once):

    .venv/bin/python -m experiments.numerics.sqrt_branches COMPATIBLE AVX2 AVX512

Branches other than COMPATIBLE are granted on Intel CPUs only. Without portable mode's
replacement (core.mkl_preload), so run it as a plain interpreter, not through `baton`.
"""
from __future__ import annotations

import os
import subprocess
import sys

COUNT = """
import torch
from core.mkl_branch import effective_branch
from stages.numerics_probe import fixed_values
x = fixed_values((1 << 16,), 5).abs() * 1e-3
exact = x.double().sqrt().float()
print(effective_branch(), int((x.sqrt() != exact).sum()), int((x.pow(0.5) != exact).sum()))
"""


def main(branches: list[str]) -> None:
    print("MKL_CBWR     branch run   sqrt wrong   pow(x, 0.5) wrong   (of 65536)")
    for branch in branches or ["COMPATIBLE"]:
        env = {**os.environ, "MKL_CBWR": branch, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        env.pop("LD_PRELOAD", None)
        out = subprocess.run([sys.executable, "-c", COUNT], env=env, check=True,
                             capture_output=True, text=True).stdout
        ran, wrong, wrong_pow = out.rsplit(maxsplit=2)
        print(f"{branch:<12} {ran:<12} {wrong:>10}   {wrong_pow:>17}")


if __name__ == "__main__":
    main(sys.argv[1:])
