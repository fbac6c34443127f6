"""SFT -> RM -> RL with real DeepSpeed workers: the RM reports its new head, RL resumes
bit for bit under world size 2 / ZeRO 1, and an RL checkpoint without its RL state
is refused naming the missing component.

One short SFT run feeds both later stages (module fixture): the whole file runs in a
few minutes on 2 CPU cores.
"""
from __future__ import annotations

import json
import shutil

import pytest

from ckpt.content_digest import content_digest_of
from tests.conftest import metrics, run_baton

N, K = 4, 2
RL_LAYOUT = ["parallel.world_size=2", "parallel.zero_stage=1", f"stage.max_steps={N}",
             f"stage.save_every={K}", "stage.eval_every=2", "stage.eval_samples=8"]


def _ckpt(run_dir, stage, step):
    return run_dir / stage / "checkpoints" / f"step-{step:06d}"


@pytest.fixture(scope="module")
def trained(sft_and_rm):
    """An SFT checkpoint, then an RM trained from it (its run output kept for checks)."""
    return sft_and_rm


@pytest.mark.slow
def test_reward_model_reports_its_new_head_and_evaluates_pairs(trained):
    home, _, rm = trained
    assert "new parameters (freshly initialised) ['score.weight'], dropped ['lm_head.weight']" \
        in rm.stdout
    result = json.loads((home / "rm" / "result.json").read_text())
    assert result["init_from"] == {"new": ["score.weight"], "dropped": ["lm_head.weight"]}
    last = metrics(home, "rm")[4]
    assert 0.0 <= last["eval_accuracy"] <= 1.0
    assert 0.0 < last["eval_pref_entropy"] <= 0.6932  # at most ln 2 nats
    meta = json.loads((_ckpt(home, "rm", 4) / "meta.json").read_text())
    assert meta["model"]["architecture"] == "LlamaForSequenceClassification"


@pytest.mark.slow
def test_a_policy_cannot_start_from_a_reward_model_checkpoint(trained):
    from ckpt.errors import IncompatibleCheckpoint
    from ckpt.weights import load_weights_into
    from stages.model import load_model_and_tokenizer

    home, _, _ = trained
    policy, _ = load_model_and_tokenizer(home / "model")
    with pytest.raises(IncompatibleCheckpoint, match=r"missing or unexpected \['lm_head.weight'\]"):
        load_weights_into(policy, _ckpt(home, "rm", 4))


def _rl(run_dir, sft, rm, ray_address, *extra):
    # The RM's continuous score gives groups non-zero advantages even while the
    # briefly trained policy never hits an exact answer.
    return run_baton("stage", "rl", f"run.dir={run_dir}", f"stage.init_from={sft}", f"rl.ray.address={ray_address}",
                     "stage.reward_model_weight=0.5", f"stage.reward_model_from={rm}",
                     "stage.kl_target=0.01", "rl.rollout.spares=0", *RL_LAYOUT, *extra, check=True)


@pytest.mark.slow
def test_rl_resume_from_step_k_is_bit_exact_and_an_rl_checkpoint_needs_its_state(trained, tmp_path, ray_address):
    home, sft, _ = trained
    rm = _ckpt(home, "rm", 4)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    _rl(straight, sft, rm, ray_address)
    # The resume loads its frozen models from copies elsewhere: their identity in the RL
    # state is what they hold, so the copies are accepted and the final states equal.
    moved_sft, moved_rm = tmp_path / "moved" / "sft" / sft.name, tmp_path / "moved" / "rm" / rm.name
    shutil.copytree(sft, moved_sft)
    shutil.copytree(rm, moved_rm)
    _rl(resumed, moved_sft, moved_rm, ray_address, f"resume={_ckpt(straight, 'rl', K)}")

    diff = run_baton("ckpt", "diff", str(_ckpt(straight, "rl", N)), str(_ckpt(resumed, "rl", N)))
    assert diff.returncode == 0, diff.stdout + diff.stderr
    a, b = metrics(straight, "rl"), metrics(resumed, "rl")
    assert sorted(b) == list(range(K + 1, N + 1))
    keys = ("loss", "reward", "kl", "entropy", "response_length", "kl_coef", "eval_reward")
    for step in b:
        assert [a[step].get(k) for k in keys] == [b[step].get(k) for k in keys], step
    # Step 0 is the evaluation of the handed-off policy before any update (eval_at_start).
    assert "eval_reward" in a[0] and "loss" not in a[0]
    assert any(a[s]["loss"] != 0.0 for s in a if s >= 1), "advantages were all zero: nothing was tested"
    assert a[N]["kl_coef"] != a[1]["kl_coef"]  # the adaptive controller moved and was restored

    state = json.loads((_ckpt(straight, "rl", N) / "objective.json").read_text())
    assert state["reference"] == {"loaded_from": "checkpoint", "content_digest": content_digest_of(sft)}
    assert state["reward_model"] == {"loaded_from": "checkpoint", "content_digest": content_digest_of(rm)}
    assert str(home) not in json.dumps(state)  # a state file names no place
    damaged = tmp_path / "damaged" / "step-000002"
    shutil.copytree(_ckpt(straight, "rl", K), damaged)
    manifest = json.loads((damaged / "manifest.json").read_text())
    del manifest["components"]["rl_state"]
    (damaged / "manifest.json").write_text(json.dumps(manifest))
    refused = run_baton("stage", "rl", f"run.dir={straight}", f"stage.init_from={sft}",
                        f"resume={damaged}", *RL_LAYOUT)
    assert refused.returncode != 0
    assert "missing component 'rl_state'" in refused.stdout + refused.stderr
