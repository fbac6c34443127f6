"""Trainability diagnostics of a language-model checkpoint on your own data.

The next stage's held-out rows are what the checkpoint is judged on: their loss (on
the tokens that stage trains on), and the mean token entropy of the policy's own
continuations of their prompts at the rollout temperature: the signal that a
checkpoint has collapsed and will resist exploration. Your data has no built-in
checker, so accuracy is not measured here (RL prompts scored by your reward function
add pass@k: stages.rl).
"""
from __future__ import annotations

import torch

from handoff.diagnostics import PROBE_SEED_OFFSET, _completion_mask, sample
from stages.data.render import IGNORE
from stages.tasks import HELDOUT


@torch.no_grad()
def data_diagnostics(model, tokenizer, examples, *, probe_prompts: int, samples_per_prompt: int,
                     temperature: float, max_new_tokens: int, seed: int) -> dict:
    """`examples`: the next stage's stages.data.examples.FileExamples."""
    model.eval()
    generator = torch.Generator().manual_seed(seed + PROBE_SEED_OFFSET)
    stop_ids = {tokenizer.eos_token_id}
    losses, entropy_sum, entropy_count = [], 0.0, 0.0
    for index in range(min(probe_prompts, examples.size(HELDOUT))):
        ids, labels = examples.lm_example(HELDOUT, index)
        losses.append(float(model(input_ids=torch.tensor([ids]), labels=torch.tensor([labels])).loss))
        answer_at = next((i for i, label in enumerate(labels) if label != IGNORE), len(labels))
        prompt = ids[:max(answer_at, 1)]
        tokens, entropy = sample(model, prompt, samples_per_prompt, max_new_tokens, temperature, generator)
        mask = _completion_mask(tokens, stop_ids)
        entropy_sum += float((entropy * mask).sum())
        entropy_count += float(mask.sum())
    return {"heldout_loss": sum(losses) / max(len(losses), 1),
            "entropy": entropy_sum / max(entropy_count, 1.0)}
