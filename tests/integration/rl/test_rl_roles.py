"""RL roles on a real Ray instance: a rollout actor killed mid-step, the reward actor
killed, the trainer SIGKILLed, and two rollout actors instead of one all end in a final
policy bit-identical to an uninterrupted run; the journal holds every prompt of every
step exactly once; `baton rl replay` reproduces a later checkpoint; a damaged journal is
refused by replay and by `baton ckpt verify`. Every step reports the rollout/trainer
log-prob mismatch (non-zero by default), and `rl.batch_invariant=true` makes it zero.

One Ray instance serves the module (`rl.ray.address`, started here on loopback); one
short SFT + RM run feeds every RL run.
"""
from __future__ import annotations

import json
import math
import shutil
from collections import Counter

import pytest

from stages.fork_server import ENV as FORK_SERVER
from stages.rl.warm_worker import RAY_WORKER_MODULE
from tests.conftest import run_baton

N, K, FAULT_STEP = 6, 3, 4  # steps, save_every, the 0-based step faults fire at
RL = [f"stage.max_steps={N}", f"stage.save_every={K}", "stage.global_batch=4", "stage.micro_batch=2",
      "stage.group_size=4", f"stage.eval_every={N}", "stage.eval_samples=4", "stage.eval_at_start=false",
      "stage.kl_target=0.01", "stage.reward_model_weight=0.5",
      # No warm spare (one process importing torch and a model less per run) but where a
      # case tests it: the final policy must not depend on whether there is one.
      "rl.rollout.spares=0"]


def _ckpt(run_dir, stage, step):
    return run_dir / stage / "checkpoints" / f"step-{step:06d}"


@pytest.fixture(scope="module")
def trained(sft_and_rm):
    home, sft, _ = sft_and_rm
    return sft, _ckpt(home, "rm", 4)


def _rl(run_dir, trained, ray_address, *extra, check=True, env=None):
    sft, rm = trained
    return run_baton("stage", "rl", f"run.dir={run_dir}", f"stage.init_from={sft}",
                     f"stage.reward_model_from={rm}", f"rl.ray.address={ray_address}", *RL, *extra,
                     check=check, env=env)


def _actor_forks(fork_server) -> list[dict]:
    """Ray workers of the RL roles forked by the test process's fork server."""
    return [f for f in fork_server.forks() if f["module"] == RAY_WORKER_MODULE]


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory, trained, ray_address, fork_server):
    """The uninterrupted run, and the Ray workers forked for its actors."""
    run_dir = tmp_path_factory.mktemp("straight")
    before = len(_actor_forks(fork_server))
    _rl(run_dir, trained, ray_address)
    return run_dir, _actor_forks(fork_server)[before:]


@pytest.fixture(scope="module")
def straight(straight_run):
    return straight_run[0]


def segments(run_dir) -> list[dict]:
    root = run_dir / "rl" / "journal"
    return [json.loads((d / "records.json").read_text()) for d in sorted(root.glob("step-*"))]


def audit(run_dir) -> list[dict]:
    """Every step 1..N present once; every prompt the sampler draws for a step present exactly
    once with its whole group; returns the events of every segment."""
    from stages.sampler import GlobalSampler
    from stages.tasks import SPLIT_SIZES, TRAIN

    sampler = GlobalSampler(SPLIT_SIZES[TRAIN], 4, 2, 1, 1234)
    records = segments(run_dir)
    assert [r["step"] for r in records] == list(range(1, N + 1))
    events = []
    for r in records:
        step = r["step"] - 1
        expected = [i for m in range(sampler.accumulation_steps) for i in sampler.micro_batch_indices(step, m, 0)]
        assert [p["prompt_index"] for p in r["prompts"]] == expected, r["step"]
        pairs = Counter((s["prompt_index"], s["sample"]) for s in r["samples"])
        assert set(pairs) == {(p, i) for p in expected for i in range(4)}, r["step"]
        assert max(pairs.values()) == 1, f"duplicated samples at step {r['step']}"
        assert {s["policy_version"] for s in r["samples"]} == {step}
        events += [dict(e, segment=r["step"]) for e in r["events"]]
    return events


def same_final_policy(a, b) -> None:
    diff = run_baton("ckpt", "diff", str(_ckpt(a, "rl", N)), str(_ckpt(b, "rl", N)))
    assert diff.returncode == 0, diff.stdout[-3000:] + diff.stderr[-2000:]


@pytest.mark.slow
def test_the_actors_are_forked_from_a_warm_process(straight_run):
    """The rollout and the reward actor's Ray workers (stages.rl.warm_worker); the
    `two_rollout_actors` case below starts every process cold and ends identical."""
    _, forked = straight_run
    assert len(forked) == 2, forked


@pytest.mark.slow
def test_an_uninterrupted_run_journals_every_step_and_learns_from_nonzero_advantages(straight):
    events = audit(straight)
    assert [e["version"] for e in events if e["kind"] == "weight_sync"] == list(range(N))
    assert not [e for e in events if e["kind"] in ("role_failure", "retry", "trainer_restart")]
    samples = [s for r in segments(straight) for s in r["samples"]]
    assert any(s["advantage"] != 0.0 for s in samples), "all advantages zero: nothing was tested"
    assert all(s["reward"]["rm"] is not None for s in samples)
    state = json.loads((_ckpt(straight, "rl", N) / "objective.json").read_text())
    assert state["journal"] == {"cursor": N}


FAULTS = {
    "two_rollout_actors": ["rl.rollout.actors=2"],
    "rollout_actor_killed": ["rl.rollout.spares=1", f"rl.faults.kill_rollout_actor_at_step={FAULT_STEP}"],
    "rollout_actor_killed_no_spare": ["rl.rollout.spares=0",
                                      f"rl.faults.kill_rollout_actor_at_step={FAULT_STEP}"],
    "reward_actor_killed": [f"rl.faults.kill_reward_actor_at_step={FAULT_STEP}"],
    "trainer_killed": [f"rl.faults.kill_trainer_at_step={FAULT_STEP}"],
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(FAULTS))
def test_the_final_policy_is_bit_identical_whatever_failed(case, straight, trained, ray_address,
                                                         tmp_path, fork_server):
    # Two rollout actors start cold (no fork server: trainer and actors are fresh
    # interpreters) and must end where the warm straight run ended.
    cold = case == "two_rollout_actors"
    before = _actor_forks(fork_server)
    run = _rl(tmp_path, trained, ray_address, *FAULTS[case], env={FORK_SERVER: ""} if cold else None)
    same_final_policy(straight, tmp_path)
    events = audit(tmp_path)
    kinds = Counter((e["kind"], e.get("role")) for e in events)
    if cold:
        assert _actor_forks(fork_server) == before, "an actor of the cold run was forked warm"
        served = {s["served_by"] for r in segments(tmp_path) for s in r["samples"]}
        assert served == {"rollout-0", "rollout-1"}
        assert not [e for e in events if e["kind"] == "role_failure"]
    elif case == "rollout_actor_killed":
        # The warm spare takes the slot (one weight sync); Ray restarts rollout-0 meanwhile.
        assert kinds[("role_failure", "rollout-0")] >= 1 and kinds[("failover", "rollout-0")] == 1
        assert kinds[("weight_resync", "rollout-1")] == 1 and kinds[("retry", "rollout-1")] >= 1
        assert {e["segment"] for e in events if e["kind"] == "role_failure"} == {FAULT_STEP + 1}
        later = [e for e in events if e["kind"] == "weight_sync" and e["version"] > FAULT_STEP]
        assert all(e["actors"] == ["rollout-1"] for e in later)
    elif case == "rollout_actor_killed_no_spare":
        # Ray restarts rollout-0; it is re-synced to the current version and serves again.
        assert kinds[("role_failure", "rollout-0")] >= 1 and kinds[("weight_resync", "rollout-0")] == 1
        assert kinds[("retry", "rollout-0")] >= 1 and not kinds[("failover", "rollout-0")]
    elif case == "reward_actor_killed":
        assert kinds[("role_failure", "reward")] >= 1 and kinds[("recovered", "reward")] >= 1
        assert not [e for e in events if e["kind"] == "weight_resync"]
    else:
        restarts = [e for e in events if e["kind"] == "trainer_restart"]
        # Killed mid-step FAULT_STEP (0-based): resumed from step-K, step K+1 re-applied
        # from the journal (no new rollout: one weight sync per step overall), then on.
        assert len(restarts) == 1 and restarts[0]["resumed_at_step"] == K
        assert restarts[0]["caught_up"] == list(range(K + 1, FAULT_STEP + 1))
        assert [e["version"] for e in events if e["kind"] == "weight_sync"] == list(range(N))
        assert "restart 1/1 from the last RL checkpoint" in run.stdout


@pytest.mark.slow
def test_replay_from_a_mid_run_checkpoint_reproduces_the_later_one(straight):
    replay = run_baton("rl", "replay", str(_ckpt(straight, "rl", K)), f"--to-step={N}")
    assert replay.returncode == 0, replay.stdout[-3000:] + replay.stderr[-2000:]
    assert "REPLAYED bit for bit" in replay.stdout
    assert "no rollout or reward role is started" in replay.stdout
    assert "RL roles on Ray" not in replay.stdout


@pytest.mark.slow
def test_a_damaged_or_missing_journal_is_never_replayed(straight, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(straight, copy, ignore=shutil.ignore_patterns("replays"))
    segment = copy / "rl" / "journal" / f"step-{K + 2:06d}" / "tensors.safetensors"
    data = bytearray(segment.read_bytes())
    data[-1] ^= 0xFF
    segment.write_bytes(bytes(data))
    refused = run_baton("rl", "replay", str(_ckpt(copy, "rl", K)), f"--to-step={N}")
    assert refused.returncode == 2
    assert f"step-{K + 2:06d}" in refused.stderr and "sha256" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not (copy / "rl" / "replays").exists()
    verify = run_baton("ckpt", "verify", str(_ckpt(copy, "rl", N)))
    assert verify.returncode == 1 and f"step-{K + 2:06d}" in verify.stderr, verify.stderr

    shutil.rmtree(copy / "rl" / "journal")
    missing = run_baton("rl", "replay", str(_ckpt(copy, "rl", K)), f"--to-step={N}")
    assert missing.returncode == 2 and "journal" in missing.stderr and "is missing" in missing.stderr


@pytest.mark.slow
def test_journal_show_lists_steps_samples_and_one_sample(straight):
    table = run_baton("rl", "journal", "show", str(straight), check=True)
    assert len([line for line in table.stdout.splitlines() if line.strip()[:1].isdigit()]) == N
    one = json.loads(run_baton("rl", "journal", "show", str(straight), "--step=2", "--sample=5",
                               "--json", check=True).stdout)
    sample = one["sample"]
    assert sample["sample"] == 1 and len(sample["tokens"]) == len(sample["trainer_logp"])
    assert sample["policy_version"] == 1
    bad = run_baton("rl", "journal", "show", str(straight), "--step=99")
    assert bad.returncode == 2 and "--step 99" in bad.stderr


def test_an_unreachable_ray_address_is_refused_naming_it(tmp_path):
    refused = run_baton("stage", "rl", f"run.dir={tmp_path}", "rl.ray.address=127.0.0.1:9",
                        "stage.max_steps=1", timeout=180)
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    assert "rl.ray.address='127.0.0.1:9'" in refused.stderr and "Traceback" not in refused.stderr
    assert not (tmp_path / "rl" / "checkpoints").exists()


MISMATCH = ("logp_diff_mean", "logp_diff_max", "token_mult_prob_error", "rollout_trainer_kl")


def step_records(run_dir) -> dict[int, dict]:
    lines = (run_dir / "rl" / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r for r in map(json.loads, lines) if "logp_diff_max" in r}


def journaled_logprobs(run_dir, step: int):
    from ckpt import journal

    records, tensors = journal.read_segment(run_dir / "rl" / "journal", step)  # verified
    return records, tensors["rollout_logp"], tensors["trainer_logp"], tensors["mask"] > 0


@pytest.mark.slow
def test_every_step_reports_the_rollout_trainer_mismatch_and_it_is_not_zero(straight):
    """The default (batched) path: the engine's log-probs come from its sampling forwards,
    the trainer's from one forward per group, and they differ in the last bits."""
    steps = step_records(straight)
    assert sorted(steps) == list(range(1, N + 1))
    for step, record in steps.items():
        journaled, rollout, trainer, keep = journaled_logprobs(straight, step)
        gap = (trainer.double() - rollout.double())[keep].abs()
        # The metric is what the journal's own tensors say, and the journal says the same.
        assert record["logp_diff_max"] == gap.max().item() == journaled["mismatch"]["logp_diff_max"]
        assert record["logp_diff_mean"] == pytest.approx(gap.mean().item(), rel=1e-9)
        assert record["token_mult_prob_error"] == pytest.approx(math.exp(record["logp_diff_mean"]))
        for key in MISMATCH:
            assert journaled["mismatch"][key] == pytest.approx(record[key], rel=1e-9), key
        assert journaled["mismatch"]["batch_invariant"] is False
    assert max(r["logp_diff_max"] for r in steps.values()) > 0.0, "no mismatch to measure"
    shown = run_baton("rl", "journal", "show", str(straight), check=True).stdout
    assert "max|Δlogp|" in shown


@pytest.mark.slow
def test_batch_invariant_mode_makes_rollout_and_trainer_logprobs_bitwise_equal(trained, ray_address,
                                                                               tmp_path):
    """With mis at cap 1 on top: a ratio of exactly 1 everywhere, so the correction masks
    nothing (a ratio above 1 anywhere would be a token it drops)."""
    import torch

    _rl(tmp_path, trained, ray_address, "rl.batch_invariant=true", "rl.correction=mis",
        "rl.correction_cap=1.0")
    steps = step_records(tmp_path)
    assert sorted(steps) == list(range(1, N + 1))
    for step, record in steps.items():
        journaled, rollout, trainer, keep = journaled_logprobs(tmp_path, step)
        assert keep.any() and torch.equal(rollout, trainer), f"step {step}: the log-probs differ"
        assert journaled["mismatch"]["batch_invariant"] is True
        assert journaled["mismatch"]["logp_diff_max"] == record["logp_diff_max"] == 0.0
        assert record["token_mult_prob_error"] == 1.0 and record["rollout_trainer_kl"] == 0.0
        assert record["correction_changed_fraction"] == 0.0


ENV_FAULTS = ["rl.env.task=program", "rl.faults.env_crash_rate=0.1", "rl.faults.env_timeout_rate=0.05",
              "rl.env.timeout_s=2", "rl.env.cpu_s=1", "rl.env.retries=1"]


@pytest.mark.slow
def test_environment_failures_are_retried_or_dropped_and_never_scored(trained, ray_address, tmp_path):
    """Each completion runs as a program in the environment role's sandbox, 10% of the runs
    crashing and 5% hanging (injected, seeded). The run completes; no environment failure
    is a reward; each one was retried or its group dropped with a record; every prompt of
    every step is accounted for; ETTR is reported."""
    run = _rl(tmp_path, trained, ray_address, *ENV_FAULTS)
    assert "1 environment actor (sandboxed programs)" in run.stdout + run.stderr
    events = audit(tmp_path)  # every prompt of every step once, with its whole group
    failed_attempts = dropped_prompts = retried = 0
    for record in segments(tmp_path):
        dropped = {p["prompt_index"] for p in record["prompts"] if p.get("dropped")}
        dropped_prompts += len(dropped)
        for s in record["samples"]:
            tries = s["env"]
            assert tries and [t["attempt"] for t in tries] == list(range(1, len(tries) + 1))
            failed = [t for t in tries if t["kind"] == "env_failure"]
            failed_attempts += len(failed)
            retried += sum(t is not tries[-1] for t in failed)
            assert all(t["injected"] in ("crash", "timeout") for t in failed), failed
            if tries[-1]["kind"] == "env_failure":  # out of retries: never a reward
                assert s["prompt_index"] in dropped and s["reward"] is None
            elif s["prompt_index"] not in dropped:
                assert s["reward"]["checker"] == (1.0 if tries[-1]["kind"] == "success" else 0.0)
            if s["prompt_index"] in dropped:
                assert s["reward"] is None and s["advantage"] is None  # not trained on
    kinds = Counter(e["kind"] for e in events)
    assert kinds["env_failure"] == failed_attempts > 0 and retried > 0
    assert kinds["drop"] == dropped_prompts > 0, "no group ran out of retries: nothing was tested"
    steps = step_records(tmp_path)
    assert sum(r["env_failures"] for r in steps.values()) == failed_attempts
    assert sum(r["groups_dropped"] for r in steps.values()) == dropped_prompts
    alerts = [e for e in events if e["kind"] == "env_alert"]
    assert len(alerts) == sum(r["env_failure_rate"] > 0.05 for r in steps.values()) > 0
    shown = run_baton("rl", "journal", "show", str(tmp_path), check=True).stdout
    assert f"environment: {failed_attempts} environment failure(s), none scored; " \
           f"{dropped_prompts} group(s) dropped" in shown
    ettr = float(shown.split("ETTR ")[1].split()[0])
    assert 0 < ettr < 1


@pytest.mark.slow
def test_an_async_run_keeps_its_staleness_bound_and_replays_bit_for_bit(trained, ray_address, tmp_path):
    """rl.max_staleness=2: step s trains on rollouts requested at policy version max(0, s-2),
    each sample carrying its version; the journal and metrics hold the staleness, and
    `baton rl replay` reproduces the later checkpoint from the journal."""
    _rl(tmp_path, trained, ray_address, "rl.max_staleness=2", "rl.correction=tis")
    total = Counter()
    for record in segments(tmp_path):
        step = record["step"] - 1
        stale = Counter(step - s["policy_version"] for s in record["samples"])
        assert set(stale) == {min(step, 2)}, (record["step"], stale)  # the bound, and no less
        assert record["staleness"] == {str(k): v for k, v in stale.items()}
        total.update(stale)
    assert total == {0: 16, 1: 16, 2: 16 * (N - 2)}
    steps = step_records(tmp_path)
    assert [steps[s]["staleness_max"] for s in sorted(steps)] == [0, 1] + [2] * (N - 2)
    assert any(r["correction_changed_fraction"] >= 0 for r in steps.values())
    replay = run_baton("rl", "replay", str(_ckpt(tmp_path, "rl", K)), f"--to-step={N}")
    assert replay.returncode == 0 and "REPLAYED bit for bit" in replay.stdout, replay.stdout[-3000:]
    shown = run_baton("rl", "journal", "show", str(tmp_path), check=True).stdout
    assert f"staleness (policy versions behind the trainer, samples): 0: 16, 1: 16, 2: {16 * (N - 2)}" in shown
