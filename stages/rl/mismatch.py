"""The rollout/trainer log-prob mismatch, and the importance correction for it.

The rollout engine and the trainer score the same tokens with the same weights, yet
their log-probs differ (stages.rl.logprobs says why). Left unmeasured, that silently
makes the update off-policy. Every step reports, over all response tokens (Δ = trainer
log p - rollout log p):

- `logp_diff_mean`, `logp_diff_max`: mean and max |Δ|;
- `token_mult_prob_error`: exp(mean |Δ|), as NeMo-RL reports it (1 = no mismatch);
- `rollout_trainer_kl`: KL(rollout ‖ trainer), the k3 estimate e^Δ - Δ - 1 on the
  rollout's samples.

`rl.correction` reweights the policy-gradient term per token by the ratio
π_trainer/π_rollout = e^Δ (the behaviour policy being the rollout engine's): `tis` caps
it at C, `mis` zeroes the tokens above C. The weight carries no gradient.
"""
from __future__ import annotations

import math

import torch

KEYS = ("logp_diff_mean", "logp_diff_max", "token_mult_prob_error", "rollout_trainer_kl")
CHANGED = "correction_changed_fraction"
# Sums that add across groups and ranks, then the maximum, which does not.
TOKENS, ABS_SUM, KL_SUM, CHANGED_SUM, ABS_MAX = range(5)


def no_mismatch() -> torch.Tensor:
    """The sums before any token: what a step starts from."""
    return torch.zeros(5, dtype=torch.float64)


def mismatch_sums(rollout_logp: torch.Tensor, trainer_logp: torch.Tensor, mask: torch.Tensor,
                  changed: torch.Tensor | None = None) -> torch.Tensor:
    """[tokens, Σ|Δ|, Σ k3, tokens the correction changed, max |Δ|] (float64) over the
    response tokens of one group; `changed`: the correction's per-token flags (G, T)."""
    keep = mask > 0
    delta = (trainer_logp.detach().double() - rollout_logp.double())[keep]
    out = no_mismatch()
    if delta.numel():
        out[TOKENS] = delta.numel()
        out[ABS_SUM] = delta.abs().sum()
        out[KL_SUM] = (torch.exp(delta) - delta - 1.0).sum()
        out[ABS_MAX] = delta.abs().max()
    if changed is not None:
        out[CHANGED_SUM] = changed[keep].sum()
    return out


def merged(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    out = a + b
    out[ABS_MAX] = torch.maximum(a[ABS_MAX], b[ABS_MAX])
    return out


def all_reduced(sums: torch.Tensor) -> torch.Tensor:
    """One step's sums over every rank (a collective when there is a process group)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return sums
    total, peak = sums.clone(), sums[ABS_MAX:ABS_MAX + 1].clone()
    dist.all_reduce(total)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    total[ABS_MAX] = peak[0]
    return total


def metrics_of(sums: torch.Tensor, correction: str) -> dict:
    tokens = max(float(sums[TOKENS]), 1.0)
    mean = float(sums[ABS_SUM]) / tokens
    record = {"logp_diff_mean": mean, "logp_diff_max": float(sums[ABS_MAX]),
              "token_mult_prob_error": math.exp(mean),
              "rollout_trainer_kl": float(sums[KL_SUM]) / tokens}
    if correction != "none":
        record[CHANGED] = float(sums[CHANGED_SUM]) / tokens
    return record


def journal_record(sums: torch.Tensor, rl) -> dict:
    """The step's mismatch as its journal segment keeps it: the metrics, the tokens they
    cover, and how the log-probs were computed and corrected."""
    return {**metrics_of(sums, rl.correction), "tokens": int(sums[TOKENS]),
            "batch_invariant": rl.batch_invariant, "correction": rl.correction,
            "correction_cap": rl.correction_cap}


def importance_weights(logp: torch.Tensor, rollout_logp: torch.Tensor, correction: str,
                       cap: float) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(per-token weights, which tokens the cap changed), both (G, T); (None, None) for
    `none`. The ratio is computed without gradient: it weights ∇log π, it is not trained."""
    if correction == "none":
        return None, None
    ratio = torch.exp(logp.detach().double() - rollout_logp.double())
    over = ratio > cap
    if correction == "tis":
        weights = ratio.clamp(max=cap)
    elif correction == "mis":
        weights = torch.where(over, torch.zeros_like(ratio), ratio)
    else:
        raise ValueError(f"rl.correction={correction!r}")  # validated in core.config
    return weights.to(logp.dtype), over
