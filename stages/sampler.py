"""Data order by global sample index, independent of the world size.

Global step s consumes samples [s*G, (s+1)*G) of a per-epoch seeded permutation.
The step is cut into G/m micro-batches of m samples; micro-batch k goes to rank
k % W at accumulation micro-step k // W. Any (W, accumulation) split of the same
global batch therefore sees the same micro-batches, and the only saved position
is one integer.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ckpt.parallel_layout import accumulation_steps

SAMPLE_INDEX = "global_sample_index"
EPOCH = "epoch"


@dataclass
class GlobalSampler:
    dataset_size: int
    global_batch: int
    micro_batch: int
    world_size: int
    seed: int
    global_sample_index: int = 0

    def __post_init__(self):
        assert self.global_batch % (self.micro_batch * self.world_size) == 0
        self._perm_epoch, self._perm = None, None

    @property
    def accumulation_steps(self) -> int:
        return accumulation_steps(self.global_batch, self.micro_batch, self.world_size)

    @property
    def epoch(self) -> int:
        return self.global_sample_index // self.dataset_size

    def _dataset_index(self, global_index: int) -> int:
        epoch, position = divmod(global_index, self.dataset_size)
        if self._perm_epoch != epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.dataset_size)
            self._perm_epoch = epoch
        return int(self._perm[position])

    def micro_batch_indices(self, step: int, micro_step: int, rank: int) -> list[int]:
        """Dataset indices for `rank` at accumulation micro-step `micro_step` of `step`."""
        k = micro_step * self.world_size + rank
        start = step * self.global_batch + k * self.micro_batch
        return [self._dataset_index(g) for g in range(start, start + self.micro_batch)]

    def advance_to_step(self, step: int) -> None:
        self.global_sample_index = step * self.global_batch

    def state_dict(self) -> dict:
        return {SAMPLE_INDEX: self.global_sample_index, EPOCH: self.epoch,
                "global_batch": self.global_batch, "seed": self.seed,
                "dataset_size": self.dataset_size}

    def load_state_dict(self, state: dict) -> None:
        self.global_sample_index = int(state[SAMPLE_INDEX])
