"""What one `baton bench ckpt` run measures, checked before any work starts."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from core.errors import UsageError

DEFAULT_SIZES_GB = (0.25, 0.5, 1.0, 2.0)
MIN_ROUNDS = 3
# Below this the model is the smallest the sizing allows (one layer of width 128).
SMALLEST_GB = 0.001
# A bench holds about seven copies of the state at once (docs/bench.md).
LARGEST_GB = 64.0


@dataclass
class BenchOptions:
    sizes_gb: list[float] = field(default_factory=lambda: list(DEFAULT_SIZES_GB))
    """State sizes (fp32 weights + both Adam moments, 1 GB = 1e9 bytes); the largest is
    the main table, all of them form the size sweep."""
    rounds: int = MIN_ROUNDS
    """Measured saves per method, interleaved round-robin (after one warm-up save each)."""
    json_path: Path | None = None
    plot_path: Path | None = None
    quick: bool = False
    """Skip the checkpoint-every-step run on the large model (the tiny model still runs)."""
    every_step_blocks: int | None = None
    """Rounds of the default model's every-step blocks (None: bench.run.TINY_BLOCKS). Each
    round is one block of every kind; more rounds narrow the ratios' 95% intervals."""
    workdir: Path | None = None
    """Where checkpoints are written (default: a fresh directory under the system temp dir)."""
    overrides: list[str] = field(default_factory=list)
    """Hydra overrides: the default model and the stage whose batch shape training uses."""

    @property
    def main_size_gb(self) -> float:
        return max(self.sizes_gb)

    def check(self) -> None:
        for size in self.sizes_gb:
            if not math.isfinite(size) or not SMALLEST_GB <= size <= LARGEST_GB:
                raise UsageError("--size-gb", size, f"a state size in GB between {SMALLEST_GB} "
                                 f"and {LARGEST_GB} (fp32 weights + both Adam moments, 12 bytes "
                                 "per parameter), e.g. --size-gb 0.5 or --size-gb 0.25 0.5 1 2")
        if len(set(self.sizes_gb)) != len(self.sizes_gb):
            raise UsageError("--size-gb", self.sizes_gb, "each size once")
        if self.rounds < MIN_ROUNDS:
            raise UsageError("--rounds", self.rounds, f"at least {MIN_ROUNDS}: a min and a "
                             "median of fewer saves say nothing about noise")
        if self.every_step_blocks is not None and self.every_step_blocks < MIN_ROUNDS:
            raise UsageError("--every-step-blocks", self.every_step_blocks,
                             f"at least {MIN_ROUNDS} rounds of blocks: the ratios' intervals "
                             "resample whole rounds, and fewer say nothing about noise")
        for flag, path in (("--json", self.json_path), ("--plot", self.plot_path)):
            if path is not None and not path.parent.is_dir():
                raise UsageError(flag, str(path), f"a file in an existing directory; "
                                 f"{path.parent} does not exist")
        if self.plot_path is not None and self.plot_path.suffix.lower() != ".png":
            raise UsageError("--plot", str(self.plot_path), "a .png path")
        if self.workdir is not None and not self.workdir.is_dir():
            raise UsageError("--dir", str(self.workdir), "an existing directory to write "
                             "checkpoints into")
