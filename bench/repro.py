"""`baton bench repro`: what portable mode (core.repro) costs against native, per training
step (the harness: bench.stage_modes)."""
from __future__ import annotations

from bench.stage_modes import ModeBench

# What each timed mode passes to the stage; ratios are against native (the first).
MODES = {"native": ["repro.mode=native"],
         "portable-avx2": ["repro.mode=portable", "repro.isa=avx2"],
         "portable-baseline": ["repro.mode=portable", "repro.isa=baseline"]}


def repro_bench(stage: str) -> ModeBench:
    return ModeBench("repro", stage, MODES, "repro.mode cost")
