"""GRPO advantages, k3 KL, the masked loss and the completion mask, on hand-made numbers."""
from __future__ import annotations

import math

import torch

from ckpt import manifest
from stages.rl.objective import grpo_loss, group_advantages, k3_kl, masked_mean
from stages.sampling import generate, response_mask, seeded_generator


def test_group_advantages_are_zero_mean_unit_std_and_zero_for_equal_rewards():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64))
    assert torch.allclose(adv, torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=torch.float64), atol=1e-5)
    assert torch.equal(group_advantages(torch.ones(8)), torch.zeros(8))


def test_k3_is_zero_at_equal_policies_and_matches_its_formula():
    logp = torch.log(torch.tensor([0.5, 0.25]))
    assert torch.equal(k3_kl(logp, logp), torch.zeros(2))
    ref = torch.log(torch.tensor([0.25, 0.5]))
    expected = [0.5 - math.log(0.5) - 1, 2.0 - math.log(2.0) - 1]
    assert torch.allclose(k3_kl(logp, ref), torch.tensor(expected))


def test_masked_mean_averages_each_sequence_over_its_own_tokens_first():
    values = torch.tensor([[1.0, 3.0, 100.0], [2.0, 2.0, 2.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    assert masked_mean(values, mask).item() == 2.0  # (2 + 2) / 2, the 100 is masked


def test_grpo_loss_gradient_raises_logprob_of_positive_advantage_tokens():
    logp = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]])).requires_grad_()
    adv, mask = torch.tensor([1.0, -1.0]), torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, kl = grpo_loss(logp, logp.detach(), adv, mask, beta=0.1)
    loss.backward()
    assert kl.item() == 0.0
    assert torch.allclose(logp.grad, torch.tensor([[-0.25, -0.25], [0.5, 0.0]]))
    expected = -(1.0 * math.log(0.5) + -1.0 * math.log(0.5)) / 2
    assert math.isclose(loss.item(), expected, abs_tol=1e-7)


def test_response_mask_keeps_tokens_through_the_first_stop_only():
    tokens = torch.tensor([[5, 24, 7, 2], [5, 6, 7, 8], [2, 5, 24, 6]])
    mask = response_mask(tokens, (24, 2))
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]


def test_sampling_runs_exactly_max_new_tokens_forwards_and_is_seed_determined():
    calls = []

    class Uniform(torch.nn.Module):
        def forward(self, input_ids, use_cache=False):
            calls.append(input_ids.shape)
            return type("Out", (), {"logits": torch.zeros(*input_ids.shape, 7)})()

    a = generate(Uniform(), [1, 5], 3, 4, 1.0, seeded_generator(1, 0, 2, 9))
    b = generate(Uniform(), [1, 5], 3, 4, 1.0, seeded_generator(1, 0, 2, 9))
    assert len(calls) == 8 and torch.equal(a, b) and a.shape == (3, 4)


def test_an_rl_manifest_without_its_rl_state_names_the_component(tmp_path):
    m = manifest.Manifest(stage="rl", step=1, components={c: ["x"] for c in manifest.REQUIRED},
                          files={"x": {"size": 0, "sha256": ""}})
    (tmp_path / "x").write_text("")
    assert manifest.structure_problems(tmp_path, m) == [
        "missing component 'rl_state' in manifest.json"]
    m.stage = "sft"
    assert manifest.structure_problems(tmp_path, m) == []
