"""Portable mode on a GPU: deterministic algorithms, a fixed cuBLAS workspace, cuDNN
deterministic and TF32 off, and the same gradients from two identical steps.
Skipped where no GPU exists (docs/reproducibility.md)."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SCRIPT = """
import torch
from core.config import compose
from core.repro import pin_this_process
pin_this_process(compose(["repro.isa=baseline"]).repro)
assert torch.are_deterministic_algorithms_enabled()
assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
assert not torch.backends.cuda.matmul.allow_tf32
grads = []
for _ in range(2):
    torch.manual_seed(0)
    layer = torch.nn.Linear(512, 512).cuda()
    x = torch.randn(64, 512, device="cuda")
    layer(x).pow(2).sum().backward()
    grads.append(layer.weight.grad.clone())
assert torch.equal(grads[0], grads[1])
print("ok")
"""


def test_portable_mode_makes_a_gpu_step_deterministic():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]
