"""Your reward functions (stages.data.rewards): verl's shape, imported from a file or a
module, checked by name before any worker starts; at run time a failed call (raised,
too slow, not a number) is a RewardFailure naming the function, never a reward."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from core.errors import ConfigError
from stages.data.rewards import RewardFailure, RewardScorer, check_on_rows, load_reward_functions

GOOD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str.strip() == str(ground_truth)) + extra_info.get("bonus", 0)

def slow(data_source, solution_str, ground_truth, extra_info=None):
    import time
    time.sleep(5)
    return 1.0

def raises(data_source, solution_str, ground_truth, extra_info=None):
    raise KeyError("no such field")

def text(data_source, solution_str, ground_truth, extra_info=None):
    return "1.0"

def nan(data_source, solution_str, ground_truth, extra_info=None):
    return float("nan")

def two_args(solution, answer):
    return 1.0
'''


@dataclass
class Fn:
    path: str | None = None
    name: str = "compute_score"
    module: str | None = None
    weight: float = 1.0


@dataclass
class Reward:
    functions: list
    timeout_s: float = 1.0


@pytest.fixture
def rewards_file(tmp_path):
    path = tmp_path / "rewards.py"
    path.write_text(GOOD)
    return str(path)


def test_weighted_functions_from_a_file_and_a_module(rewards_file, tmp_path, monkeypatch):
    (tmp_path / "my_rewards").mkdir()
    (tmp_path / "my_rewards" / "__init__.py").write_text(
        "def length(data_source, solution_str, ground_truth, extra_info):\n"
        "    return len(solution_str) if data_source == 'math' else -1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    functions = load_reward_functions(Reward([Fn(rewards_file, weight=2.0),
                                              Fn(module="my_rewards:length", weight=0.5)]))
    assert [f.label for f in functions] == [f"{rewards_file}::compute_score", "my_rewards:length"]
    scorer = RewardScorer(functions, 1.0, "/data/prompts.jsonl")
    # data_source: the row's own column of that name, else the dataset's path.
    assert scorer.score(" 7 ", 7, {"bonus": 0.25, "data_source": "math"}) == 2.0 * 1.25 + 0.5 * 3
    assert scorer.score("8", 7, {}) == 0.0 + 0.5 * -1.0
    with pytest.raises(ConfigError, match="math:fabs has the signature"):
        load_reward_functions(Reward([Fn(module="math:fabs")]))


def test_a_function_that_cannot_be_used_is_refused_by_name(tmp_path, rewards_file):
    broken = tmp_path / "broken.py"
    broken.write_text("def compute_score(:\n")
    cases = [
        (Fn(str(tmp_path / "absent.py")), "rl.reward.functions[0].path="),
        (Fn(str(broken)), "importing it failed (SyntaxError"),
        (Fn(rewards_file, name="missing"), "has no function 'missing'"),
        (Fn(rewards_file, name="two_args"), "cannot take fn(data_source, solution_str, ground_truth, extra_info)"),
        (Fn(module="no_such_module_here:fn"), "cannot import no_such_module_here"),
        (Fn(), "names neither a path"),
    ]
    for spec, needle in cases:
        with pytest.raises(ConfigError) as caught:
            load_reward_functions(Reward([spec]))
        assert needle in str(caught.value), (needle, str(caught.value))


@pytest.mark.parametrize("name,needle", [
    ("slow", "ran past rl.reward.timeout_s=0.2 s"),
    ("raises", "raised KeyError: 'no such field'"),
    ("text", "returned '1.0'; expected a finite number"),
    ("nan", "returned nan; expected a finite number"),
])
def test_a_failed_call_is_a_failure_never_a_reward(rewards_file, name, needle):
    scorer = RewardScorer(load_reward_functions(Reward([Fn(rewards_file, name=name)])), 0.2, "d")
    with pytest.raises(RewardFailure, match=needle.replace("(", r"\(").replace(")", r"\)")):
        scorer.score("7", 7, {})


class Prompts:
    """Three RL rows, as stages.data.examples.FileExamples.prompt gives them."""

    def size(self, split):
        return 3

    def prompt(self, split, index):
        return [1, 2], index + 40, {"level": index}


def test_functions_are_tried_on_the_first_rows_before_any_worker(rewards_file):
    good = RewardScorer(load_reward_functions(Reward([Fn(rewards_file)])), 1.0, "d")
    check_on_rows(good, Prompts(), "train")
    bad = RewardScorer(load_reward_functions(Reward([Fn(rewards_file, name="text")])), 1.0, "d")
    with pytest.raises(ConfigError, match=r"on row 1 of the RL train data \(solution_str = its ground truth '40'\)"):
        check_on_rows(bad, Prompts(), "train")


def _group(checker: list[float]):
    from stages.rl.groups import Group

    n = len(checker)
    return Group(prompt_index=3, prompt_ids=[1], seeds=list(range(n)), policy_version=0,
                 tokens=torch.zeros(n, 2, dtype=torch.long), mask=torch.ones(n, 2),
                 rollout_logp=torch.zeros(n, 2), checker=torch.tensor(checker, dtype=torch.float64),
                 rm=None, served_by={})


def test_failed_calls_are_recorded_and_an_unscored_sample_drops_its_group():
    from stages.rl.env_records import apply_reward_failures

    events: list = []
    retried = {"sample": 1, "attempt": 1, "reason": "f raised ValueError: x", "retried": True}
    scored = _group([1.0, 0.0])  # sample 1 failed once, then returned a number
    apply_reward_failures(scored, {"failures": [retried]}, 4, events)
    assert scored.dropped is None
    assert events == [{"kind": "env_failure", "role": "reward", "step": 4, "prompt_index": 3, **retried}]
    events.clear()
    failures = [{"sample": 0, "attempt": a, "reason": "f ran past rl.reward.timeout_s=1 s",
                 "retried": a < 2} for a in (1, 2)]
    unscored = _group([float("nan"), 1.0])
    apply_reward_failures(unscored, {"failures": failures}, 4, events)
    assert unscored.dropped == {"kind": "reward_function", "samples": [0], "attempts": 2}
    assert [e["kind"] for e in events] == ["env_failure", "env_failure", "drop"]
    assert events[-1]["cause"] == "reward_function" and events[-1]["samples"] == [0]
