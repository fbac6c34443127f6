"""The pieces of the RL roles that need no Ray: per-sample seeds, the CPU rollout engine's
re-issue property (a restarted engine given the same weights and seeds reproduces the lost
samples exactly), weight digests, and a step's journal segment round trip."""
from __future__ import annotations

import pytest
import torch

from ckpt import journal
from stages.rl.engine import CpuRolloutEngine, RolloutRequest, weights_digest
from stages.rl.groups import Group, groups_of, segment_of, trained_of
from stages.rl.source import sample_seeds


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The built-in model, made in this process (unit tests start none): which kernels
    initialised it does not matter to what these tests compare."""
    from core.config.compose import compose
    from stages.model import create_builtin, builtin_model_dir

    cfg = compose([f"run.dir={tmp_path_factory.mktemp('model')}"])
    create_builtin(cfg.model, cfg.seed, builtin_model_dir(cfg))
    return builtin_model_dir(cfg)


def test_sample_seeds_depend_on_step_prompt_and_sample_only():
    seeds = sample_seeds(1234, 3, 17, 4)
    assert seeds == sample_seeds(1234, 3, 17, 4)
    assert len(set(seeds)) == 4
    assert seeds[:2] == sample_seeds(1234, 3, 17, 2)  # the group size does not shift seeds
    assert sample_seeds(1234, 3, 18, 4) != seeds and sample_seeds(1234, 4, 17, 4) != seeds


def test_a_restarted_engine_with_the_same_weights_reproduces_the_lost_samples(model_dir):
    first = CpuRolloutEngine(model_dir)
    state = {k: v + 0.01 * torch.randn_like(v) for k, v in first.model.state_dict().items()}
    digest = first.load_weights(7, state)
    assert digest == weights_digest(state)
    request = RolloutRequest(step=7, prompt_index=3, prompt_ids=[1, 8, 14, 4, 17],
                             seeds=sample_seeds(1234, 7, 3, 4), policy_version=7,
                             max_new_tokens=4, temperature=1.0)
    lost = first.generate(request)
    restarted = CpuRolloutEngine(model_dir)  # as after a Ray restart: initial weights
    assert restarted.load_weights(7, state) == digest
    again = restarted.generate(request)
    assert torch.equal(lost.tokens, again.tokens) and torch.equal(lost.logp, again.logp)
    assert lost.tokens.shape == (4, 4) and len({tuple(r) for r in lost.tokens.tolist()}) > 1


def test_a_weight_digest_changes_with_any_byte():
    state = {"a": torch.zeros(3), "b": torch.ones(2, dtype=torch.float64)}
    changed = {"a": torch.tensor([0.0, 0.0, 1e-30]), "b": state["b"]}
    assert weights_digest(state) != weights_digest(changed)
    assert weights_digest(state) == weights_digest(dict(reversed(list(state.items()))))


def _group(prompt: int, rm: bool) -> Group:
    g = torch.Generator().manual_seed(prompt)
    return Group(prompt, [1, 2, 3], [11 * prompt + i for i in range(3)], 4,
                 torch.randint(0, 50, (3, 4), generator=g), torch.ones(3, 4),
                 torch.randn(3, 4, generator=g), torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64),
                 torch.randn(3, generator=g) if rm else None, {"actor": "rollout-1"})


@pytest.mark.parametrize("rm", [True, False])
def test_a_step_segment_round_trips_exactly(tmp_path, rm):
    groups = [_group(5, rm), _group(9, rm)]
    trained = {g.prompt_index: {"trainer_logp": torch.randn(3, 4), "advantage": torch.randn(3),
                                "kl": torch.rand(3, dtype=torch.float64)} for g in groups}
    records, tensors = segment_of(5, 0.05, groups, trained, [{"kind": "weight_sync", "version": 4}],
                                  (1.0, 0.5))
    journal.write_segment(tmp_path, 5, records, tensors)
    back = groups_of(*journal.read_segment(tmp_path, 5))
    for a, b in zip(groups, back):
        assert (a.prompt_index, a.prompt_ids, a.seeds, a.policy_version) == \
            (b.prompt_index, b.prompt_ids, b.seeds, b.policy_version)
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.rollout_logp, b.rollout_logp)
        assert torch.equal(a.rewards(1.0, 0.5), b.rewards(1.0, 0.5))  # the bytes replay trains on
        assert (b.rm is None) == (not rm)
    again = trained_of(*journal.read_segment(tmp_path, 5))
    assert all(torch.equal(again[p]["kl"], trained[p]["kl"]) for p in trained)
    assert [s["prompt_index"] for s in records["samples"]] == [5, 5, 5, 9, 9, 9]
