"""Token sampling for RL rollouts and greedy evaluation, written out by hand.

Every call runs exactly `max_new_tokens` forward passes whatever the samples contain:
under ZeRO-3 each forward is a collective (parameters are gathered), so ranks must
never stop early on their own. The sequences are re-forwarded in full each time
(no KV cache): the built-in model and sequences are tiny, and one code path for
every attention implementation is worth more here than the saved FLOPs.
"""
from __future__ import annotations

from math import comb

import numpy as np
import torch


# Generator streams: a training rollout sample is keyed by (step, prompt, sample), an
# eval sample by prompt only.
TRAIN_STREAM, EVAL_STREAM = 0, 1


def seeded_generator(*key: int) -> torch.Generator:
    """A CPU generator seeded from integers only (e.g. seed, step, prompt index), so a
    rollout never depends on the rank, the world size or the global RNG state."""
    seed = int(np.random.SeedSequence([int(k) for k in key]).generate_state(1)[0])
    return torch.Generator().manual_seed(seed)


@torch.no_grad()
def generate(model, prompt_ids: list[int], n: int, max_new_tokens: int, temperature: float,
             generator: torch.Generator | None) -> torch.Tensor:
    """(n, max_new_tokens) completion tokens of one prompt; greedy when generator is None."""
    sequences = torch.tensor([prompt_ids] * n, dtype=torch.long)
    for _ in range(max_new_tokens):
        logits = model(input_ids=sequences, use_cache=False).logits[:, -1, :].float()
        if generator is None:
            token = logits.argmax(dim=-1, keepdim=True)
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            token = torch.multinomial(probs, 1, generator=generator)
        sequences = torch.cat([sequences, token], dim=1)
    return sequences[:, len(prompt_ids):]


def response_mask(tokens: torch.Tensor, stop_ids: tuple[int, ...]) -> torch.Tensor:
    """1.0 up to and including the first stop token (newline / eos), 0.0 after it."""
    is_stop = torch.zeros_like(tokens, dtype=torch.bool)
    for stop in stop_ids:
        is_stop |= tokens == stop
    stopped_before = torch.cumsum(is_stop.long(), dim=1) - is_stop.long()
    return (stopped_before == 0).float()


def decode_rows(tokenizer, tokens: torch.Tensor, stop_ids=None) -> list[str]:
    """Text of each row up to its first eos, or first of `stop_ids` (what follows is not
    part of the answer)."""
    stops = set(stop_ids or (tokenizer.eos_token_id,))
    texts = []
    for row in tokens.tolist():
        end = next((i for i, token in enumerate(row) if token in stops), len(row))
        texts.append(tokenizer.decode(row[:end], skip_special_tokens=True))
    return texts


def stop_token_ids(tokenizer, model_dir) -> tuple[int, ...]:
    """Where a completion of your model ends: EOS and every id its generation config names
    as one (a chat model's end of turn, Llama-3's <|eot_id|>), each once."""
    import json
    from pathlib import Path

    ids = [tokenizer.eos_token_id]
    config = Path(model_dir) / "generation_config.json"
    if config.is_file():
        eos = json.loads(config.read_text()).get("eos_token_id")
        ids += eos if isinstance(eos, list) else [eos]
    return tuple(dict.fromkeys(i for i in ids if i is not None))


def greedy_accuracy(model, tokenizer, tasks, split: str, count: int, max_new_tokens: int) -> float:
    """Share of `count` fixed prompts whose greedy answer line equals the sum."""
    from stages.data.render import text_ids
    from stages.tasks import check_answer

    hits = 0.0
    for index in range(count):
        problem = tasks.problem(split, index)
        ids = text_ids(tokenizer, problem.prompt, bos=True, eos=False)
        tokens = generate(model, ids, 1, max_new_tokens, 1.0, None)
        hits += check_answer(problem, decode_rows(tokenizer, tokens)[0])
    return hits / max(count, 1)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)
