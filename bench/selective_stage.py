"""One real `baton stage sft` of the selective bench, in its own process (as
bench.stage_modes runs them), and what it left behind: the loss of every step
(metrics.jsonl) and what every save wrote (its manifest's `files`, never its
`references`, which an earlier save wrote)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from core.config.compose import quoted
from ckpt import manifest
from ckpt.layout import checkpoints_dir, committed_steps, step_of

from bench.selective_options import SelectiveBenchOptions

STAGE = "sft"
LAYERS = "layers/"
"""Where a selective save puts each layer group's file (ckpt.selective.layer_rel)."""


def common_overrides(options: SelectiveBenchOptions) -> list[str]:
    """What every run of one bench shares: the user's overrides, then the bench's own
    (bench_owns refused any clash), so the runs differ only where the bench says."""
    return [*options.overrides, "parallel=single", f"stage.max_steps={options.steps}",
            f"stage.save_every={options.save_every}", f"stage.keep_last={options.keep_last}",
            "mlflow.enabled=false"]  # the bench logs itself; its stages are not runs to log


def selective_overrides(options: SelectiveBenchOptions) -> list[str]:
    return [f"ckpt.selective.threshold={options.threshold!r}",
            f"ckpt.selective.full_every={options.full_every}"]


@dataclass
class StageRun:
    run_dir: Path
    seconds: float
    """Wall time of the whole `baton stage` process (start-up, training, saves)."""

    @property
    def checkpoints(self) -> Path:
        return checkpoints_dir(self.run_dir, STAGE)

    def losses(self) -> dict[int, float]:
        """Training loss per step (evaluation lines carry no `loss`)."""
        lines = (self.run_dir / STAGE / "metrics.jsonl").read_text().splitlines()
        return {rec["step"]: rec["loss"] for rec in map(json.loads, lines) if "loss" in rec}

    def saves(self) -> list[dict]:
        """Every committed save, oldest first: the bytes it wrote and what it referenced."""
        found = []
        for path in committed_steps(self.checkpoints):
            kept = manifest.read(path)
            found.append({
                "step": step_of(path), "checkpoint": path.name,
                "bytes": kept.total_bytes(), "files": len(kept.files),
                "layers_written": sorted(rel for rel in kept.files if rel.startswith(LAYERS)),
                "referenced_bytes": sum(entry["size"] for entry in kept.references.values()),
                "references": {rel: entry["checkpoint"]
                               for rel, entry in sorted(kept.references.items())}})
        return found


def run_stage(run_dir: Path, overrides: list[str]) -> StageRun:
    command = [sys.executable, "-m", "baton.cli", "stage", STAGE, quoted("run.dir", run_dir),
               *overrides]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"bench ckpt --selective: `{' '.join(command)}` failed "
                           f"({done.returncode}):\n{done.stderr[-2000:]}")
    return StageRun(run_dir, seconds)
