"""The sandbox runs real processes: a program that writes outside its scratch directory,
opens a socket, starts a process or computes forever is contained and classified as the
policy's failure; a sandbox that crashes, hangs or cannot start is the environment's,
and the environment role retries those, then drops the group, and never scores them."""
from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from stages.rl.env_records import apply_environment, env_step_metrics, ettr
from stages.rl.environment import GroupRunner, program_of
from stages.rl.groups import Group, groups_of, segment_of, trained_of
from stages.sandbox import ENV_FAILURE, POLICY_FAILURE, SUCCESS, Limits, run_program

LIMITS = Limits(timeout_s=4.0, cpu_s=1, memory_mb=256)


@pytest.mark.parametrize("program, kind, reason", [
    ("19", SUCCESS, "correct"),
    ("12+7", SUCCESS, "correct"),
    ("print(19)", SUCCESS, "correct"),
    ("18", POLICY_FAILURE, "wrong answer"),
    ("1 9", POLICY_FAILURE, "raised SyntaxError"),
    ("", POLICY_FAILURE, "wrong answer"),
    ("open('/tmp/baton-sandbox-escape','w').write('x')", POLICY_FAILURE, "denied: sandbox: writing"),
    ("__import__('os').remove('/etc/hostname')", POLICY_FAILURE, "denied: sandbox: os.remove"),
    ("__import__('socket').socket().connect(('127.0.0.1', 5432))", POLICY_FAILURE, "denied: sandbox: socket."),
    ("__import__('subprocess').run(['true'])", POLICY_FAILURE, "denied: sandbox: subprocess.Popen"),
    ("__import__('os').fork()", POLICY_FAILURE, "denied: sandbox: os.fork"),
    ("import os\nwhile True: os.fork()", POLICY_FAILURE, "denied: sandbox: os.fork"),  # a fork bomb
    ("__import__('multiprocessing').Process(target=print).start()", POLICY_FAILURE, "denied: sandbox: os.fork"),
    ("__import__('ctypes').CDLL(None)", POLICY_FAILURE, "denied: sandbox: ctypes."),
    ("len(bytearray(10**10))", POLICY_FAILURE, "raised MemoryError"),
    ("while True: pass", POLICY_FAILURE, "used its 1 s of CPU"),
])
def test_the_policys_programs_are_contained_and_classified(tmp_path, program, kind, reason):
    outcome = run_program(program, "19", LIMITS, tmp_path)
    assert (outcome.kind, outcome.reason[:len(reason)]) == (kind, reason), outcome
    assert not Path("/tmp/baton-sandbox-escape").exists()
    assert list(tmp_path.iterdir()) == []  # the scratch directory is gone


def test_a_program_may_write_inside_its_scratch_directory_only(tmp_path):
    inside = run_program("open('notes.txt','w').write('x') and 19", "19", LIMITS, tmp_path)
    assert inside.kind == SUCCESS, inside


@pytest.mark.parametrize("fault, reason", [("crash", "env_crash"), ("timeout", "env_timeout"),
                                           ("infra", "env_infra")])
def test_a_failing_sandbox_is_an_environment_failure(tmp_path, fault, reason):
    outcome = run_program("19", "19", LIMITS, tmp_path, fault)
    assert outcome.kind == ENV_FAILURE and outcome.reason.startswith(reason), outcome


def test_a_program_that_blocks_without_computing_is_counted_as_the_environments(tmp_path):
    """Documented limit: waiting is not attributable by CPU time, so it is never scored."""
    outcome = run_program("__import__('signal').pause()", "19", LIMITS, tmp_path)
    assert outcome.kind == ENV_FAILURE and outcome.reason.startswith("env_timeout"), outcome


def _runner(tmp_path, retries=2, **rates) -> GroupRunner:
    return GroupRunner(7, LIMITS, retries, {"crash": rates.get("crash", 0.0),
                                             "timeout": rates.get("timeout", 0.0),
                                             "infra": rates.get("infra", 0.0)}, tmp_path)


def test_environment_failures_are_retried_in_a_fresh_sandbox_and_scored_only_on_success(tmp_path):
    runner = _runner(tmp_path, retries=5, crash=0.5)
    faults = [[runner.fault(3, 11, s, a) for a in range(6)] for s in range(4)]
    assert faults == [[runner.fault(3, 11, s, a) for a in range(6)] for s in range(4)]  # seeded
    result = runner.run_group(3, 11, ["19\n", "18\n", "19", "x"], "19")
    for sample, tries in enumerate(result["attempts"]):
        first_clean = next(a for a, f in enumerate(faults[sample]) if f is None)
        assert len(tries) == first_clean + 1  # every injected crash retried, then it ran
        assert all(t["kind"] == ENV_FAILURE for t in tries[:-1]) and tries[-1]["kind"] != ENV_FAILURE
    assert result["dropped"] is None and result["rewards"] == [1.0, 0.0, 1.0, 0.0]


def test_a_group_whose_retries_run_out_is_dropped_and_recorded_never_scored(tmp_path):
    result = _runner(tmp_path, retries=1, infra=1.0).run_group(0, 5, ["19", "19"], "19")
    assert result["rewards"] is None
    assert result["dropped"] == {"kind": "environment", "samples": [0, 1], "attempts": 4}
    group = Group(5, [1, 2], [10, 11], 0, torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3),
                  torch.zeros(2, 3), torch.ones(2, dtype=torch.float64), None, {"actor": "rollout-0"})
    events: list = []
    apply_environment(group, result, 0, events)
    assert group.dropped and torch.isnan(group.checker).all()  # no reward to train on
    assert [e["kind"] for e in events] == ["env_failure"] * 4 + ["drop"]
    assert [e["retried"] for e in events[:4]] == [True, False, True, False]
    assert env_step_metrics([group])["groups_dropped"] == 1
    # The journal keeps the dropped group, its attempts, and no reward; a replay skips it.
    records, tensors = segment_of(1, 0.1, [group], {}, events, (1.0, 0.0))
    assert records["prompts"][0]["dropped"]["samples"] == [0, 1]
    assert all(s["reward"] is None and len(s["env"]) == 2 for s in records["samples"])
    again = groups_of(records, tensors)[0]
    assert again.dropped == group.dropped and again.env == group.env
    assert trained_of(records, tensors) == {}


def test_ettr_subtracts_the_seconds_lost_to_environment_failures():
    records = [{"step": 1, "seconds": 4.0, "env_seconds_lost": 1.0},
               {"step": 2, "seconds": 6.0, "env_seconds_lost": 0.0}, {"step": 0, "eval_reward": 0.5}]
    assert math.isclose(ettr(records), 0.9)
    assert ettr([{"step": 1, "seconds": 1.0}]) is None


def test_the_program_is_the_completions_first_line():
    assert program_of(" 12+7 \nanything after") == "12+7"
    assert os.sep not in program_of("19")
