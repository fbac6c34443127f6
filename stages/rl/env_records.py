"""What the environment role's results do to a step (rank 0, stages.rl.source), and
the numbers the trainer reports from them.

A group the role dropped keeps its tokens in the journal, with no reward (NaN checker)
and a `dropped` record naming the kind and count; the trainer leaves it out of the
update. Every environment failure becomes an `env_failure` event, every dropped group
a `drop` event, and a step whose environment failure rate exceeds `rl.env.alert_rate`
an `env_alert` event; the journal keeps each sample's every attempt.
"""
from __future__ import annotations

import torch

from stages.sandbox import ENV_FAILURE


def apply_environment(group, result: dict, step: int, events: list) -> None:
    group.env = result["attempts"]
    for sample, tries in enumerate(result["attempts"]):
        for attempt in tries:
            if attempt["kind"] == ENV_FAILURE:
                events.append({"kind": "env_failure", "role": "environment", "step": step,
                               "prompt_index": group.prompt_index, "sample": sample,
                               "attempt": attempt["attempt"], "reason": attempt["reason"],
                               "injected": attempt["injected"], "seconds": attempt["seconds"],
                               "retried": attempt is not tries[-1]})
    dropped = result["dropped"]
    if dropped is not None:
        group.dropped = dropped
        group.checker = torch.full((len(group.seeds),), float("nan"), dtype=torch.float64)
        events.append({"kind": "drop", "role": "environment", "step": step,
                       "prompt_index": group.prompt_index, "cause": dropped["kind"],
                       "samples": dropped["samples"], "attempts": dropped["attempts"]})
    else:
        group.checker = torch.tensor(result["rewards"], dtype=torch.float64)


def apply_reward_failures(group, score: dict, step: int, events: list) -> None:
    """Your reward functions' failed calls (stages.data.rewards) are environment failures:
    each recorded; a sample none of whose attempts returned a number drops its group."""
    for failure in score.get("failures") or ():
        events.append({"kind": "env_failure", "role": "reward", "step": step,
                       "prompt_index": group.prompt_index, **failure})
    unscored = [i for i, value in enumerate(group.checker.tolist()) if value != value]  # NaN
    if unscored:
        group.dropped = {"kind": "reward_function", "samples": unscored,
                         "attempts": len(score.get("failures") or ())}
        events.append({"kind": "drop", "role": "reward", "step": step,
                       "prompt_index": group.prompt_index, "cause": "reward_function",
                       "samples": unscored, "attempts": group.dropped["attempts"]})


def attempts_of(groups) -> list[dict]:
    return [a for g in groups if g.env for tries in g.env for a in tries]


def step_alert(groups, step: int, threshold: float, events: list) -> None:
    numbers = env_step_metrics(groups)
    rate, failures, runs = numbers["env_failure_rate"], numbers["env_failures"], numbers["env_runs"]
    if rate > threshold:
        events.append({"kind": "env_alert", "role": "environment", "step": step, "rate": rate,
                       "threshold": threshold, "failures": failures, "attempts": runs})
        print(f"[rl] ALERT step {step + 1}: environment failure rate {rate:.1%} > "
              f"{threshold:.1%} ({failures} of {runs} sandbox runs)", flush=True)


def env_step_metrics(groups) -> dict:
    """The step's environment numbers, for metrics.jsonl and MLflow: runs, failures, their
    rate, dropped groups, and the seconds spent in runs that ended in an environment
    failure (`env_seconds_lost`: what ETTR subtracts)."""
    attempts = attempts_of(groups)
    failed = [a for a in attempts if a["kind"] == ENV_FAILURE]
    return {"env_runs": len(attempts), "env_failures": len(failed),
            "env_failure_rate": len(failed) / max(len(attempts), 1),
            "groups_dropped": sum(1 for g in groups if g.dropped),
            "env_seconds_lost": sum(a["seconds"] for a in failed)}


def ettr(records: list[dict]) -> float | None:
    """Effective training time ratio of a run from its step records (metrics.jsonl):
    1 - (seconds lost to environment failures) / (seconds of the steps). None without
    environment numbers."""
    steps = [r for r in records if "env_seconds_lost" in r and "seconds" in r]
    total = sum(r["seconds"] for r in steps)
    if not steps or total <= 0:
        return None
    return 1.0 - sum(r["env_seconds_lost"] for r in steps) / total
