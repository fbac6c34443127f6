"""Trainability diagnostics of a language-model checkpoint on your own data.

The next stage's held-out rows are what the checkpoint is judged on: their loss (on
the tokens that stage trains on), and the mean token entropy of the policy's own
continuations of their prompts at the rollout temperature: the signal that a
checkpoint has collapsed and will resist exploration. On RL prompts scored by your
reward functions (stages.data.rewards) also the greedy accuracy, pass@1 / pass@k and the
within-group reward variance, as on the built-in tasks (handoff.diagnostics); SFT and
RM data have no checker, so there are none.
"""
from __future__ import annotations

import torch

from handoff.diagnostics import PROBE_SEED_OFFSET, _completion_mask, pass_at_k, sample
from stages.data.render import IGNORE, text_ids
from stages.sampling import decode_rows
from stages.tasks import HELDOUT


@torch.no_grad()
def data_diagnostics(model, tokenizer, examples, *, probe_prompts: int, samples_per_prompt: int,
                     k: int, temperature: float, max_new_tokens: int, seed: int, stop_ids,
                     scorer=None, pass_threshold: float = 1.0) -> dict:
    """`examples`: the next stage's stages.data.examples.FileExamples; `stop_ids`: where a
    completion ends (stages.sampling.stop_token_ids); `scorer`: the next stage's
    stages.data.rewards.RewardScorer when it is RL with reward functions."""
    model.eval()
    generator = torch.Generator().manual_seed(seed + PROBE_SEED_OFFSET)
    stop_ids = set(stop_ids)
    prompts = examples.plan["format"] == "prompts"
    losses, entropy_sum, entropy_count = [], 0.0, 0.0
    greedy_hits, p1, pk, variance = 0.0, [], [], []
    count = min(probe_prompts, examples.size(HELDOUT))
    for index in range(count):
        if prompts:  # the loss of the ground truth as the answer, where it is text
            prompt, answer, extra = examples.prompt(HELDOUT, index)
            answer_ids = text_ids(tokenizer, str(answer), bos=False, eos=True)
            ids, labels = list(prompt) + answer_ids, [IGNORE] * len(prompt) + answer_ids
        else:
            ids, labels = examples.lm_example(HELDOUT, index)
            answer_at = next((i for i, label in enumerate(labels) if label != IGNORE), len(labels))
            prompt = ids[:max(answer_at, 1)]
        losses.append(float(model(input_ids=torch.tensor([ids]), labels=torch.tensor([labels])).loss))
        tokens, entropy = sample(model, list(prompt), samples_per_prompt, max_new_tokens, temperature,
                                 generator)
        mask = _completion_mask(tokens, stop_ids)
        entropy_sum += float((entropy * mask).sum())
        entropy_count += float(mask.sum())
        if prompts and scorer is not None:
            greedy, _ = sample(model, list(prompt), 1, max_new_tokens, 1e-6, generator)
            greedy_hits += _passes(scorer, decode_rows(tokenizer, greedy, stop_ids), answer, extra,
                                   pass_threshold)
            correct = _passes(scorer, decode_rows(tokenizer, tokens, stop_ids), answer, extra, pass_threshold)
            p1.append(pass_at_k(samples_per_prompt, correct, 1))
            pk.append(pass_at_k(samples_per_prompt, correct, k))
            solved = correct / samples_per_prompt
            variance.append(solved * (1.0 - solved))
    result = {"heldout_loss": sum(losses) / max(len(losses), 1),
              "entropy": entropy_sum / max(entropy_count, 1.0)}
    if p1:
        result.update({"accuracy": greedy_hits / count, "pass@1": sum(p1) / len(p1),
                       f"pass@{k}": sum(pk) / len(pk), "reward_variance": sum(variance) / len(variance)})
    return result


def _passes(scorer, texts: list[str], answer, extra: dict, threshold: float) -> int:
    """Samples whose reward reaches the threshold; a failed call counts as not passing
    (a diagnostic, not training: nothing is scored with it)."""
    from stages.data.rewards import RewardFailure

    passed = 0
    for text in texts:
        try:
            passed += scorer.score(text, answer, extra) >= threshold
        except RewardFailure:
            continue
    return passed
