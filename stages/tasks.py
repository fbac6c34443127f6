"""Built-in synthetic tasks with verifiable answers: two-operand addition.

Everything is a pure function of (seed, split, index), so any rank can build any
sample and the data never depends on the world size. Operand pairs are split once
into train and held-out by a seeded hash, so held-out questions are never trained on.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

TRAIN, HELDOUT = "train", "heldout"
# Large enough that a 30-step run never wraps; the sampler still handles epochs.
SPLIT_SIZES = {TRAIN: 100_000, HELDOUT: 512}


@dataclass(frozen=True)
class Problem:
    a: int
    b: int

    @property
    def prompt(self) -> str:
        return f"{self.a}+{self.b}="

    @property
    def answer(self) -> str:
        return str(self.a + self.b)


def _is_heldout(a: int, b: int, seed: int, fraction: float) -> bool:
    digest = hashlib.blake2b(f"{seed}:{a}:{b}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64 < fraction


def _pairs(seed: int, max_operand: int, fraction: float, split: str) -> list[tuple[int, int]]:
    want_heldout = split == HELDOUT
    return [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)
            if _is_heldout(a, b, seed, fraction) == want_heldout]


class ArithmeticTasks:
    """Deterministic sample builders for every stage of the pipeline."""

    def __init__(self, seed: int, max_operand: int = 49, heldout_fraction: float = 0.1):
        self.seed = seed
        self._pairs = {s: _pairs(seed, max_operand, heldout_fraction, s) for s in (TRAIN, HELDOUT)}

    def size(self, split: str) -> int:
        return SPLIT_SIZES[split]

    def _rng(self, split: str, index: int, purpose: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, purpose, 0 if split == TRAIN else 1, index])

    def problem(self, split: str, index: int) -> Problem:
        pairs = self._pairs[split]
        a, b = pairs[int(self._rng(split, index, 1).integers(len(pairs)))]
        return Problem(a, b)

    def corpus_text(self, split: str, index: int, min_chars: int) -> str:
        """CPT: solved problems, one per line, until at least `min_chars` characters."""
        rng, pairs, lines = self._rng(split, index, 2), self._pairs[split], []
        while sum(len(line) for line in lines) < min_chars:
            a, b = pairs[int(rng.integers(len(pairs)))]
            lines.append(f"{a}+{b}={a + b}\n")
        return "".join(lines)

    def sft_example(self, split: str, index: int) -> tuple[str, str]:
        """SFT: (prompt, answer + newline); loss only on the answer."""
        p = self.problem(split, index)
        return p.prompt, p.answer + "\n"

    def preference_pair(self, split: str, index: int) -> tuple[str, str, str]:
        """RM: (prompt, chosen = correct answer, rejected = a near miss)."""
        p = self.problem(split, index)
        delta = int(self._rng(split, index, 3).choice([-10, -2, -1, 1, 2, 10]))
        wrong = max(0, p.a + p.b + delta)
        if wrong == p.a + p.b:
            wrong += 1
        return p.prompt, p.answer + "\n", f"{wrong}\n"

    def rl_prompt(self, split: str, index: int) -> Problem:
        return self.problem(split, index)


def check_answer(problem: Problem, completion: str) -> float:
    """RL checker: 1.0 when the completion's first line is exactly the sum."""
    return 1.0 if completion.split("\n", 1)[0].strip() == problem.answer else 0.0
