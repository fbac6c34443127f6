"""The files of a checkpoint besides DeepSpeed's own, and which state each one holds.

Its own module so that tools that only read checkpoints (`baton ckpt diff`, the carry
check) name them without importing the checkpointer, and with it DeepSpeed (1.7 s).
"""
from __future__ import annotations

from ckpt import manifest as manifest_io

RNG_DIR, GRAD_DIR, LAYERS_DIR = "rng", "grad_accum", "layers"
PROGRESS, DATA, META, GRAD_RECORD = "progress.json", "data.json", "meta.json", "grad_accum.json"
# The objective's own state (RL: KL controller, reference and reward-model identity).
OBJECTIVE = "objective.json"


def rng_file(rank: int) -> str:
    return f"{RNG_DIR}/rank-{rank:05d}.json"


def grad_file(rank: int) -> str:
    return f"{GRAD_DIR}/rank-{rank:05d}.safetensors"


def classify(rel: str, zero_stage: int) -> list[str]:
    """Components a file holds. DeepSpeed puts the scheduler (and, without ZeRO, the
    optimizer) into the model-states file."""
    name = rel.rsplit("/", 1)[-1]
    if name.endswith("optim_states.pt"):
        return ["optimizer"]
    if name.endswith("model_states.pt"):
        parts = ["model"]
        if name.startswith("mp_rank_00") or name.startswith("zero_pp_rank_0_"):
            parts.append("scheduler")
            if zero_stage == 0:
                parts.append("optimizer")
        return parts
    if rel.startswith(LAYERS_DIR + "/"):
        return ["model", "optimizer"]  # one layer group's weights and Adam state (ckpt.selective)
    if rel.startswith(RNG_DIR + "/"):
        return ["rng"]
    if rel.startswith(GRAD_DIR + "/") or rel == GRAD_RECORD:
        return [manifest_io.GRAD_ACCUM]
    return {PROGRESS: ["progress"], DATA: ["data"], META: ["meta"],
            OBJECTIVE: [manifest_io.RL_STATE]}.get(rel, [])
