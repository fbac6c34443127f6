"""Your reward functions (stages.data.rewards): verl's shape, imported from a file or a
module, checked by name before any worker starts; at run time a failed call (raised,
too slow, not a number) is a RewardFailure naming the function, never a reward."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

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
