"""What one `baton bench ckpt --tiers` run measures, checked before any work starts."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from core.errors import UsageError

from bench.options import MIN_ROUNDS, BenchOptions

DEFAULT_SIZE_GB = 1.0


@dataclass
class TierBenchOptions:
    size_gb: float = DEFAULT_SIZE_GB
    """State size of the one checkpoint every tier holds a copy of (the largest --size-gb)."""
    rounds: int = MIN_ROUNDS
    """Measured copies and restores per tier, interleaved across tiers (after one warm-up)."""
    json_path: Path | None = None
    plot_path: Path | None = None
    workdir: Path | None = None
    """Where the run directory (the persistent tier) and the file:// remote tier live."""
    overrides: list[str] = field(default_factory=list)
    quick: bool = False
    """Only meaningful to the save-method bench; refused here."""
    every_step_blocks: int | None = None
    """Likewise."""

    def as_bench_options(self) -> BenchOptions:
        """The same checks and state sizing as the save-method bench."""
        return BenchOptions(sizes_gb=[self.size_gb], rounds=self.rounds,
                            json_path=self.json_path, plot_path=self.plot_path,
                            workdir=self.workdir, overrides=list(self.overrides))

    def check(self) -> None:
        if self.quick:
            raise UsageError("--quick", True, "not with --tiers: it skips the save bench's "
                             "checkpoint-every-step run, which the tier bench does not have; "
                             "drop one of the two flags")
        if self.every_step_blocks is not None:
            raise UsageError("--every-step-blocks", self.every_step_blocks, "not with --tiers: "
                             "the tier bench has no checkpoint-every-step run; drop one of the "
                             "two flags")
        if self.rounds < MIN_ROUNDS:
            raise UsageError("--rounds", self.rounds, f"at least {MIN_ROUNDS} with --tiers: a "
                             "min and a median of fewer restores per tier say nothing about "
                             "noise")
        self.as_bench_options().check()
