"""`baton rl replay CHECKPOINT --to-step N`: re-apply the journaled updates after an RL
checkpoint, with no rollout, reward or environment call, and compare the result with
the original run's checkpoint at step N: bit for bit, or the first differing tensor.

The original run's config comes from the checkpoint's own meta.json (checked against
its manifest); the journal is the one beside its checkpoints, and every segment the
replay needs is checksum-verified before any worker starts. The replay trains in
`<run>/rl/replays/from-<c>-to-<N>-<k>/` and never touches the original run.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ckpt import journal
from ckpt import manifest as manifest_io
from ckpt.compat import read_meta
from ckpt.diff import diff_checkpoints
from ckpt.layout import checkpoints_dir, stage_dir, step_dirname
from ckpt.reproduce import compare_traces, read_trace
from core.config.compose import from_dict
from core.errors import BatonError
from stages.rl.steps import JOURNAL_DIR
from stages.run_files import METRICS

REPLAYS_DIR = "replays"


class ReplayNotPossible(BatonError):
    def __init__(self, checkpoint: Path, why: str, fix: str):
        self.checkpoint = checkpoint
        super().__init__(f"baton rl replay {checkpoint}: {why}. Nothing was replayed; {fix}")


@dataclass
class ReplayPlan:
    start: Path
    start_step: int
    to_step: int
    journal_root: Path
    original: Path
    attempt_dir: Path
    cfg: object
    model_dir: Path


@dataclass
class ReplayVerdict:
    identical: bool
    first_difference: str | None
    trace_divergence: dict | None
    steps: int
    replayed: Path
    original: Path

    def summary(self) -> str:
        if self.identical:
            return (f"REPLAYED bit for bit: steps {self.steps} re-applied from the journal; "
                    f"{self.replayed} is identical to {self.original}")
        where = self.first_difference or f"trace: {self.trace_divergence}"
        return f"DIVERGED: {self.replayed} differs from {self.original} first at {where}"


def plan_replay(checkpoint: Path, to_step: int) -> ReplayPlan:
    checkpoint = Path(checkpoint).resolve()
    manifest = manifest_io.verify(checkpoint)  # every file's checksum, before reading meta
    if manifest.stage != "rl":
        raise ReplayNotPossible(checkpoint, f"a {manifest.stage} checkpoint; replay re-applies RL "
                                "updates", "pass a checkpoint from <run.dir>/rl/checkpoints/")
    if to_step <= manifest.step:
        raise ReplayNotPossible(checkpoint, f"--to-step {to_step} is not after the checkpoint's step "
                                f"{manifest.step}", f"pass --to-step > {manifest.step}")
    stage_root = checkpoint.parents[1]
    root = stage_root / JOURNAL_DIR
    if not root.is_dir():
        raise ReplayNotPossible(checkpoint, f"its journal {root} is missing", "replay needs the "
                                "journal the original run wrote beside its checkpoints")
    journal.verify(root, manifest.step + 1, to_step)  # JournalDamaged names the segment
    original = checkpoint.parent / step_dirname(to_step)
    if not (original / manifest_io.MANIFEST).is_file():
        raise ReplayNotPossible(checkpoint, f"the original run kept no checkpoint at step {to_step} "
                                f"({original} is gone: stage.keep_last)", "replay to a step whose "
                                "checkpoint exists, to compare against")
    meta = read_meta(checkpoint, manifest)
    replays = stage_root / REPLAYS_DIR
    n = len(list(replays.glob(f"from-{manifest.step}-to-{to_step}-*"))) + 1 if replays.is_dir() else 1
    attempt = replays / f"from-{manifest.step}-to-{to_step}-{n}"
    cfg = from_dict(meta["config"])
    cfg = replace(cfg, run=replace(cfg.run, dir=str(attempt)), resume=str(checkpoint),
                  rl=replace(cfg.rl, replay_journal=str(root), replay_to_step=to_step,
                             faults=type(cfg.rl.faults)()))
    return ReplayPlan(checkpoint, manifest.step, to_step, root, original, attempt, cfg,
                      Path(meta["model_dir"]))


def replay_verdict(plan: ReplayPlan) -> ReplayVerdict:
    """Once `plan.cfg` has run (stages.launch.launch_stage, with `{"replay_of": start}` as
    its parent): did the replay end where the original did?"""
    replayed = checkpoints_dir(plan.attempt_dir, "rl") / step_dirname(plan.to_step)
    report = diff_checkpoints(plan.original, replayed)
    first = next((f"{f.file}:{f.first_difference}" for f in report.files if not f.identical), None)
    steps = range(plan.start_step + 1, plan.to_step + 1)
    original_trace = {k: v for k, v in read_trace(stage_dir(plan.original.parents[2], "rl") / METRICS).items()
                      if k in steps}
    divergence, _ = compare_traces(original_trace,
                                   read_trace(stage_dir(plan.attempt_dir, "rl") / METRICS))
    return ReplayVerdict(report.identical and divergence is None, first, divergence,
                         f"{steps.start}..{steps.stop - 1}", replayed, plan.original)
