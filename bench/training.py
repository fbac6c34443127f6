"""Training steps on random tokens: what the state's Adam moments and the
checkpoint-every-step run need (the loss value does not matter, the work does)."""
from __future__ import annotations

import torch


class TokenBatches:
    """Micro-batches of random token ids in the stage's shape (micro_batch x seq_len)."""

    def __init__(self, stage_cfg, vocab_size: int, seed: int = 0):
        self.shape = (stage_cfg.micro_batch, stage_cfg.seq_len)
        self.vocab = vocab_size
        self.generator = torch.Generator().manual_seed(seed)

    def next(self) -> torch.Tensor:
        return torch.randint(0, self.vocab, self.shape, generator=self.generator)

    @property
    def tokens(self) -> int:
        return self.shape[0] * self.shape[1]


def accumulation(engine) -> int:
    return int(engine.gradient_accumulation_steps())


def train_steps(engine, stage_cfg, steps: int, batches: TokenBatches | None = None) -> None:
    """`steps` optimizer steps (each `accumulation(engine)` micro-steps)."""
    batches = batches or TokenBatches(stage_cfg, engine.module.config.vocab_size)
    for _ in range(steps * accumulation(engine)):
        ids = batches.next()
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()


class TrainingStep:
    """One optimizer step of the bench state, in the two parts a save falls between: the
    forward and backward passes (which only read the weights and the optimizer state) and
    the update (which changes them)."""

    def __init__(self, state, seed: int = 2):
        self.engine, self.stage = state.engine, state.cfg.stage
        self.batches = TokenBatches(self.stage, self.engine.module.config.vocab_size, seed)

    def forward_backward(self) -> None:
        micro_steps = accumulation(self.engine)
        for index in range(micro_steps):
            ids = self.batches.next()
            self.engine.backward(self.engine(input_ids=ids, labels=ids).loss)
            if index < micro_steps - 1:
                self.engine.step()  # inside the accumulation window: no update

    def update(self) -> None:
        self.engine.step()
