"""The rollout-engine contract and its CPU implementation (a Hugging Face model).

`RolloutEngine` is the whole surface a rollout actor needs: load a versioned policy,
generate the samples of one request. A vLLM or SGLang engine on GPUs implements the
same two methods. Every sample has its own seed and every request holds exactly one
prompt's group: a sample depends on (step, prompt, sample) and the policy version only,
never on how many actors there are or which one served it.

The CPU engine runs the model's forward itself rather than `model.generate`: generate
takes one generator for the whole batch, and per-sample seeds are what make a re-issued
request (after an actor died) produce the same tokens.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Protocol

import torch

from core.repro import use_deterministic_algorithms


@dataclass(frozen=True)
class RolloutRequest:
    step: int
    prompt_index: int
    prompt_ids: list[int]
    seeds: list[int]
    """One per sample: the group size is len(seeds)."""
    policy_version: int
    max_new_tokens: int
    temperature: float
    batch_invariant: bool = False
    """rl.batch_invariant: report log-probs computed the trainer's way (stages.rl.logprobs)."""


@dataclass
class RolloutResult:
    prompt_index: int
    tokens: torch.Tensor
    """(group, max_new_tokens) int64."""
    logp: torch.Tensor
    """(group, max_new_tokens) float32: the engine's log-probability of each sampled token."""
    policy_version: int
    served_by: dict = field(default_factory=dict)


class RolloutEngine(Protocol):
    def load_weights(self, version: int, state: dict[str, torch.Tensor]) -> str:
        """Load a full policy state dict; return `weights_digest` of what was loaded."""

    def generate(self, request: RolloutRequest) -> RolloutResult:
        """The samples of one prompt, each from its own seed, at `request.policy_version`."""


def weights_digest(state: dict[str, torch.Tensor]) -> str:
    """sha256 over names, dtypes, shapes and bytes in name order: the identity of a policy
    version, computed by the trainer before a sync and by each engine after loading."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().contiguous().cpu()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def sample_generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


class CpuRolloutEngine:
    """A Hugging Face causal LM on CPU, one intra-op thread, deterministic kernels."""

    def __init__(self, model_dir, model_class=None):
        from stages.model import load_model_and_tokenizer

        torch.set_num_threads(1)
        use_deterministic_algorithms()
        self.model, self.tokenizer = load_model_and_tokenizer(model_dir, model_class)
        self.model.eval().requires_grad_(False)
        self.version: int | None = None

    def load_weights(self, version: int, state: dict[str, torch.Tensor]) -> str:
        self.model.load_state_dict(state, strict=True)
        self.version = version
        return weights_digest(self.model.state_dict())

    @torch.no_grad()
    def generate(self, request: RolloutRequest, on_token=None) -> RolloutResult:
        generators = [sample_generator(seed) for seed in request.seeds]
        group = len(generators)
        sequences = torch.tensor([request.prompt_ids] * group, dtype=torch.long)
        logps = []
        for position in range(request.max_new_tokens):
            logits = self.model(input_ids=sequences, use_cache=False).logits[:, -1, :].float()
            logp_all = torch.log_softmax(logits / request.temperature, dim=-1)
            probs = logp_all.exp()
            token = torch.stack([torch.multinomial(probs[i], 1, generator=generators[i])
                                 for i in range(group)])
            logps.append(logp_all.gather(-1, token))
            sequences = torch.cat([sequences, token], dim=1)
            if on_token is not None:
                on_token(position)
        start, logp = len(request.prompt_ids), torch.cat(logps, dim=1)
        if request.batch_invariant:
            from stages.rl.logprobs import token_logprobs_per_sequence
            # Again, each sequence alone, as the trainer computes them: bitwise its numbers.
            logp, _ = token_logprobs_per_sequence(self.model, sequences, start, request.temperature)
        return RolloutResult(request.prompt_index, sequences[:, start:], logp, request.policy_version)
