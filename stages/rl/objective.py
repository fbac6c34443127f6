"""RL: GRPO-style group policy optimisation against a frozen reference policy.

Per prompt: `group_size` completions of the current policy (sampled by the rollout
actors, stages.rl), scored by the reward actor (checker and/or reward model);
the trainer normalises rewards within the group into advantages,
and take loss = -mean(A · log π(token)) + β · KL(π‖π_ref) (k3 estimator) over the
completion tokens up to the first newline/eos. The update is on-policy (one
optimizer step per batch of rollouts) up to the rollout/trainer mismatch, which
rl.correction can weight out (stages.rl.mismatch); with rl.max_staleness > 0 the
rollouts are up to that many versions old and the correction is required.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from stages.frozen import checkpoint_identity, frozen_model, same_frozen_model
from stages.kl_controller import build_kl_controller
from stages.data.examples import FileExamples
from stages.data.render import text_ids
from stages.objective import CausalLMObjective
from stages.rl.logprobs import logprobs_of, token_logprobs
from stages.rl.mismatch import (all_reduced, importance_weights, journal_record, merged, metrics_of,
                                mismatch_sums, no_mismatch)
from stages.rl.environment import PROGRAM
from stages.sampling import EVAL_STREAM, decode_rows, generate, greedy_accuracy, seeded_generator
from stages.tasks import HELDOUT, TRAIN, check_answer

KL_CONTROLLER, REFERENCE, REWARD_MODEL = "kl_controller", "reference", "reward_model"
JOURNAL = "journal"
METRICS = ("reward", "kl", "entropy", "response_length")
# Samples per held-out prompt in eval_reward: one sample per prompt is too noisy to
# see a policy improve on a small held-out set.
EVAL_SAMPLES_PER_PROMPT = 8


# -- the math (pure functions, unit-tested) ----------------------------------------------
def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(r - mean) / (std + eps) within one group (population std: a group is all there is)."""
    return (rewards - rewards.mean()) / (rewards.std(correction=0) + eps)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(π‖π_ref) on samples from π: e^x - x - 1, x = log ref/π.
    Unbiased and never negative (Schulman, "Approximating KL divergence")."""
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1.0


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over each sequence's unmasked tokens, then over sequences (GRPO's 1/|o_i|)."""
    return ((values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)).mean()


def grpo_loss(logp, ref_logp, advantages, mask, beta: float,
              weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, mean KL) of one group; logp/ref_logp/mask are (G, T), advantages (G,);
    `weights` (G, T): the per-token importance correction of the policy term (rl.correction)."""
    kl = masked_mean(k3_kl(logp, ref_logp), mask)
    weighted = logp if weights is None else weights * logp
    policy = -masked_mean(advantages.unsqueeze(1) * weighted, mask)
    return policy + beta * kl, kl.detach()


class RlObjective(CausalLMObjective):
    """Trains on rollouts produced by the roles (stages.rl) or re-applied from the
    journal; rank 0 obtains each step's groups and broadcasts them to every rank."""

    name = "rl"

    def __init__(self, stage_cfg, tokenizer, tasks, data=None):
        super().__init__(stage_cfg, tokenizer, tasks, data)
        self.kl = build_kl_controller(stage_cfg)
        self.reference = self.reward_model = None
        self.identities: dict = {}
        self.frozen_from: dict = {}  # role -> checkpoint path (None: the model directory)
        self.model_dir = None
        self.step = 0
        self._sums = torch.zeros(len(METRICS) + 1, dtype=torch.float64)
        self._mismatch = no_mismatch()
        self.rl = None  # cfg.rl: correction and batch invariance, bound with the run config
        self.run_cfg, self.scorer = None, None
        self.steps = None  # stages.rl.steps.RlSteps, bound by the worker (needs the run config)

    def bind(self, cfg, sampler, run_dir) -> None:
        """The run's config, sampler and directory: what the journal and roles need."""
        from stages.rl.steps import RlSteps
        self.steps = RlSteps(cfg, sampler, run_dir, self)
        self.rl, self.run_cfg = cfg.rl, cfg

    def setup(self, model_dir) -> None:
        s = self.cfg
        self.model_dir = model_dir
        self.frozen_from[REFERENCE] = s.reference_from or s.init_from
        self.reference = frozen_model(self.model_class, model_dir, self.frozen_from[REFERENCE],
                                      "reference")
        self.identities[REFERENCE] = checkpoint_identity(self.frozen_from[REFERENCE], model_dir)
        if s.reward_model_weight > 0:
            # Scores come from the reward actor; the trainer records which checkpoint it is.
            self.frozen_from[REWARD_MODEL] = s.reward_model_from
            self.identities[REWARD_MODEL] = checkpoint_identity(s.reward_model_from, model_dir)

    def at_step(self, step: int) -> None:
        self.step = step

    def batch(self, split: str, indices: list[int]) -> dict:
        return {"split": split, "indices": list(indices)}

    @staticmethod
    def tokens_in(batch: dict) -> int:
        return batch.get("response_tokens", 0)

    def own_data(self) -> bool:
        return isinstance(self.data, FileExamples)

    def prompt_ids(self, index: int, split: str = TRAIN) -> list[int]:
        if self.own_data():
            return list(self.data.prompt(split, index)[0])
        problem = self.tasks.rl_prompt(split, index)
        return text_ids(self.tokenizer, problem.prompt, bos=True, eos=False)

    def stop_ids(self) -> tuple[int, ...]:
        """Where a completion ends: EOS, and for the built-in one-line answers a newline."""
        if self.own_data():
            from stages.sampling import stop_token_ids
            return stop_token_ids(self.tokenizer, self.model_dir)
        newline = self.tokenizer("\n")["input_ids"][0]
        return (newline, self.tokenizer.eos_token_id)

    def group_loss(self, model, group) -> tuple[torch.Tensor, list[float], dict]:
        """(loss, stats, what the journal records of it) for one prompt's group."""
        s = self.cfg
        start = len(group.prompt_ids)
        full = torch.cat([torch.tensor([group.prompt_ids] * group.tokens.shape[0]),
                          group.tokens], dim=1)
        # The policy's log-probs as the rollout engine computed its own (stages.rl.logprobs);
        # the reference's are not compared with anything, so they take the batched path.
        logp, logp_all = logprobs_of(self.rl.batch_invariant)(model, full, start, s.temperature)
        with torch.no_grad():
            ref_logp, _ = token_logprobs(self.reference, full, start, s.temperature)
            entropy = masked_mean(-(logp_all.exp() * logp_all).sum(-1), group.mask)
            kl_per_sample = ((k3_kl(logp, ref_logp) * group.mask).sum(dim=1)
                             / group.mask.sum(dim=1).clamp(min=1.0)).double()
        rewards = group.rewards(s.reward_checker_weight, s.reward_model_weight)
        advantages = group_advantages(rewards).float()
        weights, changed = importance_weights(logp, group.rollout_logp, self.rl.correction,
                                              self.rl.correction_cap)
        loss, kl = grpo_loss(logp, ref_logp, advantages, group.mask, self.kl.coef, weights)
        self._mismatch = merged(self._mismatch, mismatch_sums(group.rollout_logp, logp, group.mask, changed))
        stats = [float(rewards.mean()), float(kl), float(entropy), float(group.mask.sum(dim=1).mean())]
        trained = {"trainer_logp": logp.detach().float(), "advantage": advantages,
                   "kl": kl_per_sample}
        return loss, stats, trained

    def loss(self, model, batch: dict) -> torch.Tensor:
        module = getattr(model, "module", model)
        groups = self.steps.groups_for(self.step, module)  # collective on a new step
        losses, tokens = [], 0
        for index in batch["indices"]:
            group = groups[index]
            if group.dropped:  # the environment gave up on it: no reward, no update
                continue
            loss, stats, trained = self.group_loss(model, group)
            self.steps.record_trained(index, trained)
            losses.append(loss)
            tokens += int(group.mask.sum())
            self._sums += torch.tensor(stats + [1.0], dtype=torch.float64)
        self.steps.maybe_kill_trainer(self.step)
        batch["response_tokens"] = tokens
        if not losses:  # every group of this micro-batch dropped: a zero loss, same graph
            return sum(p.sum() for p in module.parameters() if p.requires_grad) * 0.0
        return torch.stack(losses).mean()

    def step_metrics(self) -> dict:
        """Means over every prompt of the step on every rank; the step's journal segment is
        committed (or, for a re-applied step, checked); then the KL controller moves on the
        step's KL (the same value on every rank)."""
        sums, self._sums = self._sums.clone(), torch.zeros_like(self._sums)
        if dist.is_initialized():
            dist.all_reduce(sums)
        means = (sums[:-1] / sums[-1].clamp(min=1.0)).tolist()
        record = dict(zip(METRICS, means), kl_coef=self.kl.coef)
        mismatch, self._mismatch = all_reduced(self._mismatch), no_mismatch()
        record.update(metrics_of(mismatch, self.rl.correction))
        if self.rl.max_staleness > 0:  # every rank holds the whole step's groups
            stale = [self.step - g.policy_version for g in self.steps.groups.values()]
            record.update(staleness_mean=sum(stale) / max(len(stale), 1), staleness_max=max(stale, default=0))
        if self.rl.env.task == PROGRAM:
            from stages.rl.env_records import env_step_metrics
            record.update(env_step_metrics(self.steps.groups.values()))
        self.steps.finish_step(self.step, self.kl.coef, journal_record(mismatch, self.rl))  # collective
        self.kl.update(record["kl"])
        return record

    @torch.no_grad()
    def evaluate(self, model) -> dict:
        """Mean checker reward of EVAL_SAMPLES_PER_PROMPT fixed-seed samples per fixed held-out
        prompt (at the rollout temperature) and greedy accuracy on the same prompts; on your
        prompts, your functions' mean reward and pass@1 / pass@k of the same samples."""
        if self.own_data():
            return self._evaluate_own(model)
        s, rewards = self.cfg, []
        for index in range(s.eval_samples):
            problem = self.tasks.rl_prompt(HELDOUT, index)
            generator = seeded_generator(self.tasks.seed, EVAL_STREAM, index)
            tokens = generate(model, self.prompt_ids(index, HELDOUT), EVAL_SAMPLES_PER_PROMPT,
                              s.max_new_tokens, s.temperature, generator)
            rewards += [check_answer(problem, text) for text in decode_rows(self.tokenizer, tokens)]
        accuracy = greedy_accuracy(model, self.tokenizer, self.tasks, HELDOUT, s.eval_samples,
                                   s.max_new_tokens)
        return {"eval_reward": sum(rewards) / max(len(rewards), 1), "eval_accuracy": accuracy}

    def _evaluate_own(self, model) -> dict:
        from stages.sampling import pass_at_k
        from stages.data.rewards import RewardFailure, scorer_for

        if self.scorer is None:
            self.scorer = scorer_for(self.run_cfg, self.data.plan)
        if not self.scorer.functions:  # a reward model alone: the reward actor's to score
            return {}
        s, rewards, p1, pk = self.cfg, [], [], []
        k = min(4, EVAL_SAMPLES_PER_PROMPT)
        for index in range(self.eval_count()):
            ids, answer, extra = self.data.prompt(HELDOUT, index)
            generator = seeded_generator(self.tasks.seed, EVAL_STREAM, index)
            tokens = generate(model, list(ids), EVAL_SAMPLES_PER_PROMPT, s.max_new_tokens,
                              s.temperature, generator)
            scores = []
            for text in decode_rows(self.tokenizer, tokens, self.stop_ids()):
                try:
                    scores.append(self.scorer.score(text, answer, extra))
                except RewardFailure:  # not a reward: left out of the mean, like a dropped group
                    continue
            rewards += scores
            passed = sum(score >= self.run_cfg.rl.reward.pass_threshold for score in scores)
            p1.append(pass_at_k(len(scores), passed, 1) if scores else 0.0)
            pk.append(pass_at_k(len(scores), passed, k) if len(scores) >= k else 0.0)
        n = max(len(p1), 1)
        # `pass_at_k`, not `pass@k`: MLflow metric names take no '@'.
        return {"eval_reward": sum(rewards) / max(len(rewards), 1), "eval_pass_at_1": sum(p1) / n,
                f"eval_pass_at_{k}": sum(pk) / n}

    # -- checkpointed state -------------------------------------------------------------
    def state_dict(self) -> dict:
        return {KL_CONTROLLER: self.kl.state_dict(), JOURNAL: self.steps.journal_state(),
                **self.identities}

    def load_state_dict(self, state: dict) -> None:
        from ckpt.errors import IncompatibleCheckpoint

        for role in (REFERENCE, REWARD_MODEL):
            path = self.frozen_from.get(role)
            if not same_frozen_model(state.get(role), self.identities.get(role), path,
                                     self.model_dir):
                raise IncompatibleCheckpoint(path or self.model_dir or role, (
                    f"RL {role} differs from the checkpoint's: saved {state.get(role)}, this run "
                    f"loaded {self.identities.get(role)}; resume with stage.{role}_from set as "
                    "it was (the checkpoint's meta.json records it under config.stage)"))
        self.kl.load_state_dict(state[KL_CONTROLLER])
        self.steps.load_journal_state(state.get(JOURNAL))
