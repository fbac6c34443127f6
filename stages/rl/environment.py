"""The environment role (`rl.env.task=program`): each sample's completion is run as a
program in a fresh sandbox (stages.sandbox) and its output checked.

Environment failures are never a reward. A sample whose run failed for the
environment's reasons is run again in a fresh sandbox, up to `rl.env.retries` times;
when they run out, the sample's whole group is dropped from the step: GRPO's advantages
are relative within a group, so a group missing a sample would be scored on a
different baseline. Every attempt is returned, for the journal.

Fault injection (`rl.faults.env_*_rate`) draws each attempt's fault from (run seed,
step, prompt, sample, attempt): a run and its re-run inject the same faults.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from stages.sandbox import ENV_FAILURE, SUCCESS, Limits, run_program

ENVIRONMENT = "environment"
PROGRAM = "program"  # rl.env.task: the environment role runs each completion
FAULT_STREAM = 0xE71  # keeps the fault draws apart from every other seeded stream


def program_of(completion: str) -> str:
    """The program is the completion's first line, as the checker reads the answer."""
    return completion.split("\n", 1)[0].strip()


class GroupRunner:
    """What the environment actor does, without Ray (unit-testable)."""

    def __init__(self, seed: int, limits: Limits, retries: int, fault_rates: dict[str, float],
                 root: Path):
        self.seed, self.limits, self.retries = seed, limits, retries
        self.fault_rates = fault_rates  # {"crash": p, "timeout": p, "infra": p}
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def fault(self, step: int, prompt_index: int, sample: int, attempt: int) -> str | None:
        draw = np.random.default_rng([self.seed, FAULT_STREAM, step, prompt_index, sample, attempt]).random()
        for kind, rate in self.fault_rates.items():
            if draw < rate:
                return kind
            draw -= rate
        return None

    def run_group(self, step: int, prompt_index: int, completions: list[str], expected: str) -> dict:
        """{"attempts": per sample, every attempt; "rewards": per sample, or None when the
        group is dropped; "dropped": {"kind", "samples", "attempts"} or None}."""
        attempts = [self._run_sample(step, prompt_index, i, program_of(text), expected)
                    for i, text in enumerate(completions)]
        failed = [i for i, tries in enumerate(attempts) if tries[-1]["kind"] == ENV_FAILURE]
        if failed:
            return {"attempts": attempts, "rewards": None,
                    "dropped": {"kind": "environment", "samples": failed,
                                "attempts": sum(len(t) for t in attempts)}}
        rewards = [1.0 if tries[-1]["kind"] == SUCCESS else 0.0 for tries in attempts]
        return {"attempts": attempts, "rewards": rewards, "dropped": None}

    def _run_sample(self, step: int, prompt_index: int, sample: int, program: str,
                    expected: str) -> list[dict]:
        tries = []
        for attempt in range(self.retries + 1):
            injected = self.fault(step, prompt_index, sample, attempt)
            outcome = run_program(program, expected, self.limits, self.root, injected)
            tries.append({**outcome.as_dict(), "attempt": attempt + 1, "injected": injected,
                          "seconds": round(outcome.seconds, 4)})
            if outcome.kind != ENV_FAILURE:
                break
        return tries


class EnvironmentActor:
    """The Ray actor around GroupRunner: decodes each sample and knows each prompt's answer."""

    def __init__(self, model_dir: str, run_dir: str, seed: int, max_operand: int,
                 heldout_fraction: float, env, faults):
        from transformers import AutoTokenizer

        from stages.tasks import ArithmeticTasks

        self.tasks = ArithmeticTasks(seed, max_operand, heldout_fraction)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        rates = {"crash": faults.env_crash_rate, "timeout": faults.env_timeout_rate,
                 "infra": faults.env_infra_rate}
        # Scratch directories live (briefly: one per attempt) under the run's RL directory.
        root = Path(run_dir) / "rl" / "sandbox" / f"actor-{os.getpid()}"
        self.runner = GroupRunner(seed, Limits(env.timeout_s, env.cpu_s, env.memory_mb),
                                  env.retries, rates, root)

    def ready(self) -> dict:
        return {"role": ENVIRONMENT, "pid": os.getpid()}

    def run(self, step: int, prompt_index: int, tokens, mask) -> dict:
        from stages.sampling import decode_rows
        from stages.tasks import TRAIN

        problem = self.tasks.rl_prompt(TRAIN, prompt_index)
        return self.runner.run_group(step, prompt_index, decode_rows(self.tokenizer, tokens),
                                     problem.answer)
