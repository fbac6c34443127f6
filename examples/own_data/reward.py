"""Reward functions for the example's RL prompts, in verl's shape:
fn(data_source, solution_str, ground_truth, extra_info) -> float.

baton calls them on every sampled completion (rl.reward.functions in baton.yaml); one
that raises, runs too long or returns something other than a number is an environment
failure, never a reward.
"""
import re

NUMBER = re.compile(r"-?\d+")


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """1.0 when the first number in the completion is the answer, else 0.0."""
    found = NUMBER.search(solution_str)
    return 1.0 if found and int(found.group()) == int(ground_truth) else 0.0


def brevity(data_source, solution_str, ground_truth, extra_info=None):
    """A small penalty per character: short answers, not essays."""
    return -min(len(solution_str), 100) / 100.0
