"""Data order is world-size independent; tokenizer round-trips; config errors are collected."""
from __future__ import annotations

import json
import random

import pytest
import torch

from core.config import compose
from core.errors import ConfigError
from ckpt.state import RngState
from stages.sampler import GlobalSampler
from stages.tasks import HELDOUT, TRAIN, ArithmeticTasks, check_answer
from stages.tokenizer import build_char_tokenizer


def _global_batches(world_size, micro_batch, steps=3, global_batch=16):
    sampler = GlobalSampler(1000, global_batch, micro_batch, world_size, seed=7)
    batches = []
    for step in range(steps):
        seen = []
        for micro in range(sampler.accumulation_steps):
            for rank in range(world_size):
                seen.append(tuple(sampler.micro_batch_indices(step, micro, rank)))
        batches.append(sorted(seen))
    return batches


def test_the_global_batch_is_the_same_for_any_world_size():
    assert _global_batches(1, 4) == _global_batches(2, 4) == _global_batches(4, 4)


def test_sampler_position_is_one_global_index():
    sampler = GlobalSampler(1000, 16, 4, 2, seed=7)
    sampler.advance_to_step(5)
    assert sampler.state_dict()["global_sample_index"] == 80
    other = GlobalSampler(1000, 16, 8, 1, seed=7)
    other.load_state_dict(sampler.state_dict())
    assert other.global_sample_index == 80


def test_heldout_questions_are_never_trained_on():
    tasks = ArithmeticTasks(seed=3)
    train = {tasks.problem(TRAIN, i).prompt for i in range(2000)}
    heldout = {tasks.problem(HELDOUT, i).prompt for i in range(200)}
    assert train.isdisjoint(heldout)
    problem = tasks.problem(HELDOUT, 0)
    assert check_answer(problem, problem.answer + "\nrest") == 1.0
    assert check_answer(problem, "x") == 0.0


def test_char_tokenizer_round_trips_text():
    tokenizer = build_char_tokenizer()
    text = "12+34=46\n7+8=15\n"
    ids = tokenizer(text)["input_ids"]
    assert len(ids) == len(text)
    assert tokenizer.decode(ids) == text


def test_rng_bundle_round_trips_through_json():
    state = json.loads(json.dumps(RngState.state_dict()))
    expected = (random.random(), torch.rand(2))
    RngState.load_state_dict(state)
    assert random.random() == expected[0] and torch.equal(torch.rand(2), expected[1])


def test_every_config_error_is_collected_before_raising():
    with pytest.raises(ConfigError) as err:
        compose(["stage.nope=1", "parallel.zero_stage=7", "stage.global_batch=6"])
    text = str(err.value)
    assert "3 configuration error(s)" in text
    assert "unknown config key 'stage.nope'" in text
    assert "parallel.zero_stage=7: expected 0, 1, 2 or 3" in text
    assert "stage.global_batch=6 is not divisible" in text


def test_rl_role_settings_are_checked_together():
    with pytest.raises(ConfigError) as err:
        compose(["stage=rl", "rl.rollout.actors=0", "rl.role_retries=-1", "rl.ray.address=nohost",
                 "parallel.zero_stage=3", "rl.replay_journal=/nonexistent/journal"])
    text = str(err.value)
    assert "5 configuration error(s)" in text
    assert "rl.rollout.actors=0: expected >= 1" in text
    assert "rl.role_retries=-1: expected >= 0" in text
    assert "rl.ray.address='nohost': expected host:port" in text
    assert "parallel.zero_stage=3 with stage rl" in text
    assert "rl.replay_journal='/nonexistent/journal': no such directory" in text


def test_an_unknown_snapshot_kind_names_both_kinds():
    with pytest.raises(ConfigError) as err:
        compose(["ckpt.snapshot=later"])
    assert ("ckpt.snapshot='later': expected lazy (the default: the staging copy overlaps "
            "the next forward and backward) or eager (the save call copies)") in str(err.value)


def test_retention_by_metric_is_checked_against_what_the_stage_records():
    with pytest.raises(ConfigError) as err:
        compose(["stage=rm", "stage.keep_best=2", "stage.keep_best_metric=eval_reward",
                 "stage.keep_best_mode=best"])
    text = str(err.value)
    assert "stage.keep_best_mode='best': expected min (lower is better) or max" in text
    assert ("stage.keep_best_metric='eval_reward': stage rm records eval_loss, eval_accuracy, "
            "eval_pref_entropy at an evaluation step") in text
    with pytest.raises(ConfigError) as err:
        compose(["stage.keep_best=1", "stage.save_every=5", "stage.eval_every=2"])
    assert "make save_every a multiple of eval_every" in str(err.value)
    cfg = compose(["stage=rl", "stage.keep_best=1", "stage.keep_best_metric=eval_reward",
                   "stage.keep_best_mode=max"])
    assert (cfg.stage.keep_best, cfg.stage.keep_best_metric) == (1, "eval_reward")
