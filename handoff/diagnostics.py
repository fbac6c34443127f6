"""Trainability diagnostics of a language-model checkpoint, computed without RL compute.

For each candidate at a handoff: held-out loss, greedy exact-match accuracy (the SFT
score), pass@1 / pass@k of the policy's own samples at the rollout temperature, the mean token
entropy of those samples — the signal that a peak-score checkpoint may have collapsed
and will resist RL exploration — and the within-group reward variance p(1-p) of those
samples: GRPO's group-normalised advantage is zero for a prompt the policy always or
never solves, so this is the share of prompts RL can learn from.
"""
from __future__ import annotations


import torch

from stages.data.render import text_ids
from stages.sampling import pass_at_k  # noqa: F401  (a diagnostic of this module, shared with RL)
from stages.tasks import HELDOUT, ArithmeticTasks, check_answer

PROBE_SEED_OFFSET = 7919  # probe sampling never shares a stream with training


def _prompt_ids(tokenizer, prompt: str) -> list[int]:
    return text_ids(tokenizer, prompt, bos=True, eos=False)


@torch.no_grad()
def sample(model, prompt_ids: list[int], n: int, max_new_tokens: int, temperature: float,
           generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """n completions of one prompt; returns (tokens [n, T], per-token entropy [n, T])."""
    ids = torch.tensor([prompt_ids] * n)
    tokens, entropies = [], []
    for _ in range(max_new_tokens):
        logits = model(input_ids=ids).logits[:, -1, :].float() / max(temperature, 1e-6)
        log_probs = torch.log_softmax(logits, dim=-1)
        entropies.append(-(log_probs.exp() * log_probs).sum(-1))
        nxt = torch.multinomial(log_probs.exp(), 1, generator=generator)
        tokens.append(nxt)
        ids = torch.cat([ids, nxt], dim=1)
    return torch.cat(tokens, dim=1), torch.stack(entropies, dim=1)


def _completion_mask(tokens: torch.Tensor, stop_ids: set[int]) -> torch.Tensor:
    """1 up to and including the first stop token (newline or eos), 0 after it."""
    mask = torch.ones_like(tokens, dtype=torch.float32)
    for row in range(tokens.shape[0]):
        for col in range(tokens.shape[1]):
            if int(tokens[row, col]) in stop_ids:
                mask[row, col + 1:] = 0
                break
    return mask


@torch.no_grad()
def lm_diagnostics(model, tokenizer, tasks: ArithmeticTasks, *, probe_prompts: int,
                   samples_per_prompt: int, k: int, temperature: float, max_new_tokens: int,
                   seed: int) -> dict:
    model.eval()
    stop_ids = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("\n")}
    generator = torch.Generator().manual_seed(seed + PROBE_SEED_OFFSET)
    losses, greedy_hits, p1, pk, variance = [], 0, [], [], []
    entropy_sum, entropy_count = 0.0, 0.0
    for index in range(probe_prompts):
        problem = tasks.problem(HELDOUT, index)
        prompt = _prompt_ids(tokenizer, problem.prompt)
        answer = text_ids(tokenizer, problem.answer + "\n", bos=False, eos=True)
        ids = torch.tensor([prompt + answer])
        labels = torch.tensor([[-100] * len(prompt) + answer])
        losses.append(float(model(input_ids=ids, labels=labels).loss))
        greedy, _ = sample(model, prompt, 1, max_new_tokens, 1e-6, generator)
        greedy_hits += check_answer(problem, tokenizer.decode(greedy[0]))
        tokens, entropy = sample(model, prompt, samples_per_prompt, max_new_tokens, temperature,
                                 generator)
        mask = _completion_mask(tokens, stop_ids)
        entropy_sum += float((entropy * mask).sum())
        entropy_count += float(mask.sum())
        correct = sum(check_answer(problem, tokenizer.decode(t)) for t in tokens)
        p1.append(pass_at_k(samples_per_prompt, int(correct), 1))
        pk.append(pass_at_k(samples_per_prompt, int(correct), k))
        solved = int(correct) / samples_per_prompt
        variance.append(solved * (1.0 - solved))
    return {"heldout_loss": sum(losses) / len(losses), "accuracy": greedy_hits / probe_prompts,
            "pass@1": sum(p1) / len(p1), f"pass@{k}": sum(pk) / len(pk),
            "entropy": entropy_sum / max(entropy_count, 1.0),
            "reward_variance": sum(variance) / len(variance)}
