"""The Ray actors of the RL roles: rollout engines and the reward scorer.

Both are restartable (`max_restarts`) and never retry a call on their own
(`max_task_retries=0`): a restarted rollout actor holds the initial weights, so the
trainer re-syncs it to the current policy version before re-issuing what was lost
(stages.rl.client). A restarted reward actor loads its reward-model checkpoint
again in `__init__` and needs nothing else.

Fault injection (`rl.faults.*`) kills the actor's own process with SIGKILL mid-request,
the hard way, and only in its first life (Ray says whether this life is a restart).
"""
from __future__ import annotations

import os
import signal

import torch

from core.repro import use_deterministic_algorithms

ROLLOUT, REWARD = "rollout", "reward"
MAX_RESTARTS = 1000


def rollout_actor_name(index: int) -> str:
    return f"{ROLLOUT}-{index}"


def _first_life() -> bool:
    import ray
    return not ray.get_runtime_context().was_current_actor_reconstructed


def _die_hard() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class RolloutActor:
    """One policy copy behind the RolloutEngine contract (CPU: stages.rl.engine)."""

    def __init__(self, index: int, model_dir: str, kill_at_step: int = -1, repro=None):
        from core.repro import apply_in_process
        from stages.rl.engine import CpuRolloutEngine

        if repro is not None:
            apply_in_process(repro)

        self.index, self.kill_at_step = index, kill_at_step
        self.engine = CpuRolloutEngine(model_dir)
        self.first_life = _first_life()

    def ready(self) -> dict:
        return {"role": rollout_actor_name(self.index), "pid": os.getpid(),
                "restarted": not self.first_life}

    def sync(self, version: int, state: dict, expected_digest: str) -> dict:
        """Load policy `version`; the digest of what was loaded must be the trainer's."""
        digest = self.engine.load_weights(version, state)
        if digest != expected_digest:
            raise RuntimeError(f"{rollout_actor_name(self.index)}: weights of policy version "
                               f"{version} arrived with digest {digest[:16]}…, sent as "
                               f"{expected_digest[:16]}…")
        return {"actor": rollout_actor_name(self.index), "version": version, "digest": digest,
                "pid": os.getpid()}

    def generate(self, request):
        if self.engine.version != request.policy_version:
            raise RuntimeError(f"{rollout_actor_name(self.index)} holds policy version "
                               f"{self.engine.version}, asked for {request.policy_version}")
        fault = (self.kill_at_step == request.step and self.first_life)
        on_token = (lambda position: _die_hard() if position == 1 else None) if fault else None
        result = self.engine.generate(request, on_token)
        result.served_by = {"actor": rollout_actor_name(self.index), "pid": os.getpid()}
        return result


class RewardActor:
    """The checker (exact answer) plus, when configured, a frozen reward model loaded from
    its checkpoint: both reward components of each sample."""

    def __init__(self, model_dir: str, reward_model_from: str | None, seed: int,
                 max_operand: int, heldout_fraction: float, kill_at_step: int = -1, repro=None,
                 data_plan: dict | None = None, reward=None, retries: int = 0):
        """`data_plan` (stages.data.prepare) and `reward` (cfg.rl): your prompts, scored by
        your reward functions instead of the checker, each failed call retried `retries`
        times before the sample's group is dropped."""
        from transformers import AutoTokenizer

        from core.repro import apply_in_process

        from stages.tasks import ArithmeticTasks

        torch.set_num_threads(1)
        use_deterministic_algorithms()
        if repro is not None:
            apply_in_process(repro)
        self.tasks = ArithmeticTasks(seed, max_operand, heldout_fraction)
        self.kill_at_step, self.first_life = kill_at_step, _first_life()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = None
        if reward_model_from is not None:
            from stages.frozen import frozen_model
            from stages.objective import pad_id
            from stages.rm import RmObjective
            self.model = frozen_model(RmObjective.model_class, model_dir, reward_model_from,
                                      "reward_model")
            if self.model.config.pad_token_id is None:  # as RmObjective.build_model trained it
                self.model.config.pad_token_id = pad_id(self.tokenizer)
        self.own_data, self.scorer, self.retries = data_plan is not None, None, retries
        if data_plan is not None and reward.reward.functions:
            from stages.data.examples import FileExamples
            from stages.data.rewards import RewardScorer, load_reward_functions
            self.examples = FileExamples(data_plan)
            self.scorer = RewardScorer(load_reward_functions(reward.reward), reward.reward.timeout_s,
                                       str(data_plan["train"]["path"]))

    def ready(self) -> dict:
        return {"role": REWARD, "pid": os.getpid(), "restarted": not self.first_life}

    @torch.no_grad()
    def score(self, step: int, prompt_index: int, prompt_ids: list[int], tokens: torch.Tensor,
              mask: torch.Tensor) -> dict:
        from stages.objective import pad, pad_id
        from stages.sampling import decode_rows
        from stages.tasks import TRAIN, check_answer

        if self.kill_at_step == step and self.first_life:
            _die_hard()
        if self.own_data:  # up to where the rollout ended it (EOS or an end of turn: the mask)
            texts = [self.tokenizer.decode(row[m > 0].tolist(), skip_special_tokens=True)
                     for row, m in zip(tokens, mask)]
        else:
            texts = decode_rows(self.tokenizer, tokens)
        failures = []
        if self.scorer is not None:
            checker, failures = self._functions(prompt_index, texts)
        elif self.own_data:  # your prompts scored by the reward model alone
            checker = torch.zeros(len(texts), dtype=torch.float64)
        else:
            problem = self.tasks.rl_prompt(TRAIN, prompt_index)
            checker = torch.tensor([check_answer(problem, text) for text in texts], dtype=torch.float64)
        rm = None
        if self.model is not None:
            rows = [prompt_ids + row[m > 0].tolist() for row, m in zip(tokens, mask)]
            batch = {"input_ids": pad(rows, pad_id(self.tokenizer)),
                     "attention_mask": pad([[1] * len(r) for r in rows], 0)}
            rm = self.model(**batch).logits.squeeze(-1).float()
        return {"prompt_index": prompt_index, "checker": checker, "rm": rm, "failures": failures}

    def _functions(self, prompt_index: int, texts: list[str]) -> tuple[torch.Tensor, list[dict]]:
        """Your functions' reward per sample (NaN where every attempt failed) and every
        failed attempt, for the journal and the drop (stages.rl.env_records)."""
        from stages.data.rewards import RewardFailure
        from stages.tasks import TRAIN

        _, answer, extra = self.examples.prompt(TRAIN, prompt_index)
        values, failures = [], []
        for sample, text in enumerate(texts):
            value = float("nan")
            for attempt in range(self.retries + 1):
                try:
                    value = self.scorer.score(text, answer, extra)
                    break
                except RewardFailure as exc:
                    failures.append({"sample": sample, "attempt": attempt + 1, "reason": str(exc),
                                     "retried": attempt < self.retries})
            values.append(value)
        return torch.tensor(values, dtype=torch.float64), failures
