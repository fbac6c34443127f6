"""Which step of AdamW differs between two CPUs: each one recomputed correctly rounded.

The numerics probe found AdamW's step to be the one operation that differed between an
AMD EPYC and an Intel Xeon in portable mode. This recomputes the probe's AdamW (three
steps on the probe's fixed inputs) by hand with torch's ops in torch's order, then again
with one step at a time replaced by its correctly rounded value (computed in float64 and
rounded once to float32). A step whose replacement changes the digest is not correctly
rounded on this CPU. Run it under portable mode's variables, e.g.

    MKL_CBWR=COMPATIBLE ATEN_CPU_CAPABILITY=avx2 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 \\
        .venv/bin/python -m experiments.numerics.adamw_parts

On the Intel Xeon of docs/reproducibility.md the square root's replacement gave the value
the AMD EPYC gave with a correctly rounded square root. `lerp`, `addcmul` and `addcdiv`
change the digest too, on any CPU: ATen's AVX2 kernels fuse or order their multiply-adds
differently from this recomputation, the same on every CPU that runs those kernels.
"""
from __future__ import annotations

import torch

from stages.numerics_probe import _adamw_digest, digest, fixed_values

LR, WEIGHT_DECAY, BETA1, BETA2, EPS = 1e-3, 0.01, 0.9, 0.999, 1e-8
STEPS = ("decay", "lerp", "addcmul", "sqrt", "div", "addcdiv")


def _f32(value: float) -> float:
    return float(torch.tensor(value, dtype=torch.float32))


def _round(tensor):
    return tensor.to(torch.float32)


def manual_adamw(exact: frozenset = frozenset()) -> str:
    """torch's single-tensor AdamW (non-capturable, CPU), with the steps named in `exact`
    replaced by their correctly rounded values; the digest of the parameters."""
    params = [fixed_values((256, 128), 21), fixed_values((53,), 22)]
    first = [torch.zeros_like(p) for p in params]
    second = [torch.zeros_like(p) for p in params]
    for step in range(3):
        for i, param in enumerate(params):
            grad = fixed_values(tuple(param.shape), 30 + step * 2 + i)
            count = step + 1
            if "decay" in exact:
                param = _round(param.double() * _f32(1 - LR * WEIGHT_DECAY))
            else:
                param = param.mul(1 - LR * WEIGHT_DECAY)
            if "lerp" in exact:
                difference = _round(grad.double() - first[i].double())
                first[i] = _round(first[i].double() + _round(_f32(1 - BETA1) * difference.double()).double())
            else:
                first[i] = first[i].lerp(grad, 1 - BETA1)
            if "addcmul" in exact:
                decayed = _round(second[i].double() * _f32(BETA2))
                square = _round(_round(_f32(1 - BETA2) * grad.double()).double() * grad.double())
                second[i] = _round(decayed.double() + square.double())
            else:
                second[i] = second[i].mul(BETA2).addcmul(grad, grad, value=1 - BETA2)
            step_size = LR / (1 - BETA1 ** count)
            correction = (1 - BETA2 ** count) ** 0.5
            root = _round(second[i].double().sqrt()) if "sqrt" in exact else second[i].sqrt()
            if "div" in exact:
                denominator = _round(root.double() / _f32(correction))
            else:
                denominator = root / correction
            denominator = denominator.add(EPS)
            if "addcdiv" in exact:
                ratio = _round(first[i].double() / denominator.double())
                param = _round(param.double() + _round(_f32(-step_size) * ratio.double()).double())
            else:
                param = param.addcdiv(first[i], denominator, value=-step_size)
            params[i] = param
    return digest(*params)


def main() -> None:
    print(f"ATen capability {torch.backends.cpu.get_cpu_capability()}")
    print(f"  torch.optim.AdamW           {_adamw_digest(foreach=False)}")
    print(f"  by hand, torch's ops        {manual_adamw()}")
    for name in STEPS:
        print(f"  {name + ' correctly rounded':<28}{manual_adamw(frozenset({name}))}")


if __name__ == "__main__":
    main()
