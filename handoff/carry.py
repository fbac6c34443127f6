"""Carry policy at a handoff: what the next stage inherits from the chosen checkpoint and
what it starts afresh, as a record for lineage and as lines a person reads.

The loading itself is `ckpt.carry` (inside the stage's workers); this is the decision.
"""
from __future__ import annotations

from dataclasses import asdict

from core.config.compose import quoted

PARTS = (("weights", "weights"), ("optimizer", "optimizer moments"),
         ("scheduler", "LR scheduler position"), ("rng", "RNG streams"))


def carry_record(carry, new_parameters: list[str], data: str | None = None) -> dict:
    """The carry policy as lineage stores it: each flag, what is reset, the new parameters,
    and where the next stage's data starts (never carried: `data`, its train path, or
    None for the built-in tasks)."""
    flags = asdict(carry)
    return {**flags, "new_parameters": list(new_parameters),
            "reset": [k for k, v in flags.items() if not v],
            "data_position": {"row": 0, "dataset": data or "built-in tasks"}}


def carry_lines(carry, target_stage: str, new_parameters: list[str], data: str | None = None) -> list[str]:
    """Each setting inherited or reset, said out loud (nanochat's 'Inherited lr=…')."""
    lines = []
    for key, label in PARTS:
        if getattr(carry, key):
            lines.append(f"{target_stage}: inherited {label} from the chosen checkpoint "
                         f"(carry.{key}=true)")
        else:
            lines.append(f"{target_stage}: {label} reset (carry.{key}=false)"
                         + (", derived from (seed, stage, rank)" if key == "rng" else ""))
    lines += [f"{target_stage}: new parameter {name} (not in the checkpoint)" for name in new_parameters]
    lines.append(f"{target_stage}: data starts at row 0 of {data or 'the built-in tasks'} "
                 "(a stage's data position is its own)")
    return lines


def inputs_as_overrides(inputs: list[dict]) -> tuple[dict | None, list[str]]:
    """A stage's handoff inputs as config overrides: the policy input is its init_from with
    the carry flags; reward-model inputs are its reward_model_from. Returns (policy, overrides)."""
    policy = next((i for i in inputs if i["role"] == "policy"), None)
    extra = [quoted("stage.init_from", policy["input_path"])] if policy else []
    if policy:
        carry = policy["carry"]
        extra += [f"stage.init_optimizer={str(carry['optimizer']).lower()}",
                  f"stage.init_scheduler={str(carry['scheduler']).lower()}",
                  f"stage.init_rng={str(carry['rng']).lower()}"]
    extra += [quoted("stage.reward_model_from", i["input_path"])
              for i in inputs if i["role"] == "reward_model"]
    return policy, extra
