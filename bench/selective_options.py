"""What one `baton bench ckpt --selective` run measures, checked before any stage starts."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from core.errors import UsageError

from bench.options import BenchOptions

DEFAULT_STEPS = 200
DEFAULT_SAVE_EVERY = 5
# Measured at the defaults (docs/bench.md): 0.01 and 0.02 wrote 1.06x and 1.37x fewer
# bytes, 0.05 2.53x, 0.1 4.06x; only 0.01 and 0.02 kept the loss within 1% after the
# restart, their restart state holding just a stale final norm. No threshold met both
# targets (>= 3x, <= 1%); 0.05 stays, the smallest tried whose restart state holds a
# stale transformer layer: the case selective persistence exists for.
DEFAULT_THRESHOLD = 0.05
DEFAULT_FULL_EVERY = 10
DEFAULT_RESTART_STEPS = 20
TOLERANCE = 0.01
"""The post-restart loss deviation the bench calls acceptable (relative, per step)."""

# Keys the bench sets itself on every stage it runs: an override of one would make the two
# runs, or a run and its restart, differ in more than the one thing compared. A key here
# also covers the keys under it (`parallel` covers `parallel.world_size`).
OWN_KEYS = ("run.dir", "resume", "parallel", "stage.max_steps", "stage.save_every",
            "stage.keep_last", "ckpt.selective")
OWN_GROUPS = ("stage",)
"""Config groups the bench chooses (`stage=sft`), while `stage.lr=...` stays open."""


@dataclass
class SelectiveBenchOptions:
    steps: int = DEFAULT_STEPS
    """stage.max_steps of every run (the learning-rate schedule depends on it)."""
    save_every: int = DEFAULT_SAVE_EVERY
    threshold: float = DEFAULT_THRESHOLD
    """ckpt.selective.threshold of the selective run (the full run has null)."""
    full_every: int = DEFAULT_FULL_EVERY
    restart_steps: int = DEFAULT_RESTART_STEPS
    """Steps after the restart whose losses are compared with the uninterrupted run."""
    json_path: Path | None = None
    plot_path: Path | None = None
    workdir: Path | None = None
    """Where the run directories are made (default: the system temp directory)."""
    overrides: list[str] = field(default_factory=list)
    not_applicable: dict[str, object] = field(default_factory=dict)
    """Flags of the other `bench ckpt` modes given with --selective: refused."""

    @property
    def keep_last(self) -> int:
        """Every save stays: the bytes of each are read from its manifest after the run."""
        return self.steps // self.save_every + 1

    @property
    def middle(self) -> int:
        """The restart is from the last composite checkpoint at or before this step."""
        return self.steps // 2

    def check(self) -> None:
        if self.not_applicable:
            flag, value = next(iter(self.not_applicable.items()))
            raise UsageError(flag, value, "not with --selective: it measures two real SFT "
                             "stages (--steps, --save-every, --threshold, --full-every, "
                             "--restart-steps), not a sized state or tiers; drop that flag")
        self._check_numbers()
        self._check_schedule()
        for override in self.overrides:
            key, value = override.split("=", 1)
            if bench_owns(key.lstrip("+~")):
                raise UsageError(key, value, "set by the bench itself on every stage it runs "
                                 "(run.dir, resume, parallel=single, stage=sft, stage.max_steps/"
                                 "save_every/keep_last, ckpt.selective.*); use --steps, "
                                 "--save-every, --threshold and --full-every instead")
        BenchOptions(json_path=self.json_path, plot_path=self.plot_path,
                     workdir=self.workdir).check()  # the same path checks as the save bench

    def _check_numbers(self) -> None:
        if not math.isfinite(self.threshold) or self.threshold < 0:
            raise UsageError("--threshold", self.threshold, "a relative update >= 0 (e.g. "
                             "0.05: a layer is rewritten once ||w - w_saved|| / ||w_saved|| "
                             "exceeds 5%)")
        if self.full_every < 2:
            raise UsageError("--full-every", self.full_every, "at least 2: with 1 every save "
                             "writes every layer, so there is nothing selective to measure")
        for flag, value in (("--steps", self.steps), ("--save-every", self.save_every),
                            ("--restart-steps", self.restart_steps)):
            if value < 1:
                raise UsageError(flag, value, "at least 1")

    @property
    def fewest_steps(self) -> int:
        """The first save writes everything; the second is the first that can reference an
        earlier one, and it must come by the middle, where the restart is taken, with
        --restart-steps steps still to come after the middle."""
        return max(4 * self.save_every, 2 * self.restart_steps)

    def _check_schedule(self) -> None:
        if self.steps < self.fewest_steps:
            raise UsageError("--steps", self.steps, f"at least {self.fewest_steps} with "
                             f"--save-every {self.save_every} and --restart-steps "
                             f"{self.restart_steps}: the restart is taken at or before the "
                             "middle of the run from a save that can reference an earlier "
                             f"one (the second save, step {2 * self.save_every}, is the "
                             f"first), and {self.restart_steps} steps must follow it")


def bench_owns(key: str) -> bool:
    return key in OWN_GROUPS or any(key == own or key.startswith(f"{own}.") for own in OWN_KEYS)
