"""The rollout/trainer mismatch metrics, the importance corrections (tis, mis) and the
per-sequence log-prob path, on hand-made numbers and a tiny random Llama."""
from __future__ import annotations

import math

import pytest
import torch

from stages.rl.objective import grpo_loss
from stages.rl.logprobs import token_logprobs_per_sequence
from stages.rl.mismatch import importance_weights, merged, metrics_of, mismatch_sums

ROLLOUT = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -0.5]])
TRAINER = torch.tensor([[-1.5, -2.0, -2.0], [-0.5, -0.25, -9.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])  # the last column is past the stop


def test_the_metrics_cover_the_response_tokens_only():
    deltas = [-0.5, 0.0, 0.0, 0.25]  # trainer - rollout where the mask is 1
    got = metrics_of(mismatch_sums(ROLLOUT, TRAINER, MASK), "none")
    mean = sum(abs(d) for d in deltas) / 4
    assert got["logp_diff_mean"] == pytest.approx(mean)
    assert got["logp_diff_max"] == 0.5  # the masked 1.0 and 8.5 do not count
    assert got["token_mult_prob_error"] == pytest.approx(math.exp(mean))
    assert got["rollout_trainer_kl"] == pytest.approx(sum(math.exp(d) - d - 1 for d in deltas) / 4)
    assert "correction_changed_fraction" not in got


def test_sums_merge_across_groups_and_equal_logprobs_give_exactly_zero():
    one = mismatch_sums(ROLLOUT[:1], TRAINER[:1], MASK[:1])
    two = mismatch_sums(ROLLOUT[1:], TRAINER[1:], MASK[1:])
    assert torch.equal(merged(one, two), mismatch_sums(ROLLOUT, TRAINER, MASK))
    same = metrics_of(mismatch_sums(ROLLOUT, ROLLOUT.clone(), MASK), "none")
    assert same == {"logp_diff_mean": 0.0, "logp_diff_max": 0.0, "token_mult_prob_error": 1.0,
                    "rollout_trainer_kl": 0.0}


def test_tis_caps_the_ratio_and_mis_drops_the_tokens_above_the_cap():
    rollout = torch.log(torch.tensor([[0.5, 0.5, 0.5]]))
    trainer = torch.log(torch.tensor([[0.25, 0.5, 0.75]]))  # ratios 0.5, 1, 1.5
    tis, over = importance_weights(trainer, rollout, "tis", 1.2)
    assert torch.allclose(tis, torch.tensor([[0.5, 1.0, 1.2]]))
    assert over.tolist() == [[False, False, True]]
    mis, _ = importance_weights(trainer, rollout, "mis", 1.2)
    assert torch.allclose(mis, torch.tensor([[0.5, 1.0, 0.0]]))
    assert importance_weights(trainer, rollout, "none", 1.2) == (None, None)
    sums = mismatch_sums(rollout, trainer, torch.ones(1, 3), over)
    assert metrics_of(sums, "tis")["correction_changed_fraction"] == pytest.approx(1 / 3)


def test_the_weights_scale_the_policy_gradient_and_carry_none_themselves():
    rollout = torch.log(torch.tensor([[0.5, 0.5]]))
    logp = torch.log(torch.tensor([[0.25, 0.75]])).requires_grad_(True)
    advantages, mask = torch.tensor([1.0]), torch.ones(1, 2)
    weights, _ = importance_weights(logp, rollout, "tis", 10.0)
    loss, _ = grpo_loss(logp, logp.detach(), advantages, mask, 0.0, weights)
    loss.backward()
    # d/dlogp of -mean(A * w * logp) with w constant: -A * w / T per token.
    assert torch.allclose(logp.grad, -weights.detach() / 2)
    plain = logp.detach().clone().requires_grad_(True)
    unit, _ = grpo_loss(plain, plain.detach(), advantages, mask, 0.0, torch.ones(1, 2))
    assert torch.equal(unit, grpo_loss(plain, plain.detach(), advantages, mask, 0.0)[0])


def test_per_sequence_logprobs_do_not_depend_on_the_batch_or_on_autograd(tmp_path):
    """The batch-invariant path: a row's log-probs alone, in a group, in eval mode without
    gradients (the rollout engine) and in train mode with them (the trainer) are the same bits."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=2, num_attention_heads=2,
                                         num_key_value_heads=2, max_position_embeddings=64))
    full = torch.randint(0, 32, (4, 12))
    model.eval()
    with torch.no_grad():
        engine, _ = token_logprobs_per_sequence(model, full, 5, 0.7)
        alone, _ = token_logprobs_per_sequence(model, full[2:3], 5, 0.7)
    model.train()
    trainer, _ = token_logprobs_per_sequence(model, full, 5, 0.7)
    assert trainer.requires_grad and torch.equal(trainer.detach(), engine)
    assert torch.equal(alone, engine[2:3])


def test_bad_correction_settings_are_refused_before_anything_runs():
    from core.config.compose import compose
    from core.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        compose(["stage=rl", "rl.correction=clip", "rl.correction_cap=0.5"])
    text = str(refused.value)
    assert "rl.correction='clip': expected one of none, tis, mis" in text
    assert "rl.correction_cap=0.5: expected >= 1" in text
    with pytest.raises(ConfigError) as stale:
        compose(["stage=rl", "rl.max_staleness=2"])
    assert "rl.max_staleness=2 with rl.correction='none'" in str(stale.value)
    assert compose(["stage=rl", "rl.max_staleness=2", "rl.correction=tis"]).rl.max_staleness == 2
