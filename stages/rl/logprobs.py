"""Token log-probabilities of sampled responses, computed one of two ways.

- **Batched** (the default): the trainer runs one forward over a whole group (G rows of
  prompt + response), while the rollout engine's log-probs come from its sampling
  forwards, whose input grows by one token per position. Different shapes take
  different kernel paths, so the two disagree in the last bits: the rollout/trainer
  mismatch (stages.rl.mismatch measures it every step).
- **Per sequence** (`rl.batch_invariant=true`): a forward of each row alone, whole and
  unpadded, in both places: the rollout engine recomputes its log-probs this way after
  sampling, and the trainer computes its own this way. Same weights, same shapes, same
  kernels: the same bits. The cost is G forwards of one row instead of one of G rows,
  plus the engine's extra pass (docs/rl.md has the measured ratio).
"""
from __future__ import annotations

import torch


def token_logprobs(model, full: torch.Tensor, start: int, temperature: float):
    """(log-prob of each token from `start` on (G, T), the full log-prob rows (G, T, V)) of
    the sampling distribution (logits / temperature), one forward over all rows."""
    logits = model(input_ids=full, use_cache=False).logits[:, start - 1:-1].float()
    logp_all = torch.log_softmax(logits / temperature, dim=-1)
    return logp_all.gather(-1, full[:, start:].unsqueeze(-1)).squeeze(-1), logp_all


def token_logprobs_per_sequence(model, full: torch.Tensor, start: int, temperature: float):
    """The same, one forward per row: a row's numbers do not depend on its batch."""
    rows = [token_logprobs(model, full[i:i + 1], start, temperature) for i in range(full.shape[0])]
    return torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])


def logprobs_of(batch_invariant: bool):
    return token_logprobs_per_sequence if batch_invariant else token_logprobs
