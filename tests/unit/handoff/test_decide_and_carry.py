"""Handoff decisions that need no checkpoint: where a reshard goes, which model the chosen
checkpoint becomes, the carry record and the stage overrides a handoff's inputs imply."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace as NS

from handoff import decide
from handoff.carry import carry_lines, carry_record, inputs_as_overrides
from ckpt.parallel_layout import Sharding


@dataclass
class Carry:
    weights: bool = True
    optimizer: bool = False
    scheduler: bool = True
    rng: bool = False


def test_reshard_destination_and_overrides():
    dst = decide.reshard_destination("/root", "sft_rl", 7, "/x/checkpoints/step-000004")
    assert dst == Path("/root/handoffs/sft_rl-7/step-000004")
    assert decide.target_overrides(Sharding(2, 3)) == ["parallel.world_size=2",
                                                       "parallel.zero_stage=3"]


def test_a_reward_model_is_loaded_as_itself():
    assert decide.loaded_as(NS(role="policy", from_stage="sft", to_stage="rl")) == "rl"
    assert decide.loaded_as(NS(role="reward_model", from_stage="rm", to_stage="rl")) == "rm"


def test_carry_record_and_lines():
    record = carry_record(Carry(), ["score.weight"])
    assert record["reset"] == ["optimizer", "rng"] and record["new_parameters"] == ["score.weight"]
    assert record["data_position"] == {"row": 0, "dataset": "built-in tasks"}
    lines = carry_lines(Carry(), "rm", ["score.weight"])
    assert "rm: optimizer moments reset (carry.optimizer=false)" in lines
    assert lines[-2] == "rm: new parameter score.weight (not in the checkpoint)"
    assert lines[-1] == "rm: data starts at row 0 of the built-in tasks (a stage's data position is its own)"
    own = carry_record(Carry(), [], "/data/pairs.jsonl")
    assert own["data_position"] == {"row": 0, "dataset": "/data/pairs.jsonl"}


def test_inputs_become_stage_overrides():
    policy = {"role": "policy", "input_path": "/p q", "handoff_id": 1,
              "carry": {"optimizer": True, "scheduler": False, "rng": True}}
    rm = {"role": "reward_model", "input_path": "/r", "handoff_id": 2}
    chosen, overrides = inputs_as_overrides([policy, rm])
    assert chosen is policy
    assert overrides == ["stage.init_from='/p q'", "stage.init_optimizer=true",
                         "stage.init_scheduler=false", "stage.init_rng=true",
                         "stage.reward_model_from='/r'"]
    assert inputs_as_overrides([rm]) == (None, ["stage.reward_model_from='/r'"])
