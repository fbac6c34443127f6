"""`baton bench batch-invariant`: what `rl.batch_invariant=true` costs against the default
(batched) log-prob path, per RL step (the harness: bench.stage_modes).

An RL step here is the whole of it: the rollout engine's sampling (plus, batch-invariant,
its second pass over each sequence alone), the reward, and the trainer's forward and
backward (batch-invariant: one sequence at a time). Each run starts its own Ray instance
with the stage, as `baton stage rl` does.
"""
from __future__ import annotations

from bench.stage_modes import ModeBench

MODES = {"fast": ["rl.batch_invariant=false"], "batch-invariant": ["rl.batch_invariant=true"]}
# The default RL batch, without evaluations (moved past the last step by the harness).
FIXED = ["stage.eval_at_start=false"]


def batch_invariant_bench() -> ModeBench:
    return ModeBench("batch-invariant", "rl", MODES, "rl.batch_invariant cost", FIXED)
