"""Did a re-run reproduce the original? Per-step trace first, then the checkpoints both
kept, step by step, down to the first differing tensor; and, when it did not, which
differences between the two environments (core.fingerprint) can explain it."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ckpt.diff import diff_checkpoints
from core import fingerprint

# Wall-clock fields differ between any two runs and say nothing about reproduction.
VOLATILE = {"seconds", "data_seconds"}


@dataclass
class Verdict:
    reproduced: bool
    first_divergence: dict | None = None
    """{"step", "metric", "original", "rerun", "abs_diff"} of the first differing value."""
    checkpoint_identical: bool | None = None
    checkpoint_first_difference: str | None = None
    steps_compared: int = 0
    notes: list[str] = field(default_factory=list)
    first_differing_checkpoint: dict | None = None
    """{"step", "tensor", "max_abs_diff"}: the earliest checkpoint both runs kept that differs."""
    environment_differences: list[str] = field(default_factory=list)
    """core.fingerprint.differences(original, re-run), likeliest causes first."""
    data_differences: list[str] = field(default_factory=list)
    """Datasets whose content changed between the original and the re-run (stages.data)."""

    def summary(self) -> str:
        data = ("; the data changed: " + "; ".join(self.data_differences)) if self.data_differences else ""
        if self.reproduced:
            text = (f"REPRODUCED bit for bit: {self.steps_compared} steps of the trace and the final "
                    "checkpoint are identical" + data)
            if self.environment_differences:
                text += "; environment differed: " + "; ".join(self.environment_differences)
            return text
        parts = []
        if self.first_divergence:
            d = self.first_divergence
            parts.append(f"DIVERGED at step {d['step']}: {d['metric']} original {d['original']!r} vs "
                         f"re-run {d['rerun']!r} (|diff| = {d['abs_diff']:.3e})")
        else:
            parts.append(f"DIVERGED: final checkpoint differs first at {self.checkpoint_first_difference}")
        if self.first_differing_checkpoint:
            c = self.first_differing_checkpoint
            parts.append(f"first differing checkpoint: step {c['step']}, tensor {c['tensor']} "
                         f"(max |diff| {c['max_abs_diff']:.3e})")
        if self.data_differences:  # named before the environment: it changes every step
            parts.append("the data changed, which explains it: " + "; ".join(self.data_differences))
        parts.append("environment differences that can explain it: "
                     + ("; ".join(self.environment_differences) or "none recorded (same fingerprint)"))
        return "; ".join(parts)


def read_trace(path: Path) -> dict[int, dict]:
    trace: dict[int, dict] = {}
    for line in Path(path).read_text().splitlines():
        record = json.loads(line)
        trace[record["step"]] = record
    return trace


def compare_traces(original: dict[int, dict], rerun: dict[int, dict]) -> tuple[dict | None, int]:
    steps = sorted(set(original) | set(rerun))
    for step in steps:
        a, b = original.get(step), rerun.get(step)
        if a is None or b is None:
            return {"step": step, "metric": "presence", "original": a is not None,
                    "rerun": b is not None, "abs_diff": float("inf")}, len(steps)
        for key in sorted((set(a) | set(b)) - VOLATILE):
            if a.get(key) != b.get(key):
                va, vb = a.get(key), b.get(key)
                numeric = isinstance(va, (int, float)) and isinstance(vb, (int, float))
                return {"step": step, "metric": key, "original": va, "rerun": vb,
                        "abs_diff": abs(va - vb) if numeric else float("inf")}, len(steps)
    return None, len(steps)


def first_differing_checkpoint(original: list[Path], rerun: list[Path]) -> dict | None:
    """The earliest step both runs kept a checkpoint of whose state differs, and where."""
    from ckpt import manifest as manifest_io

    def by_step(paths):
        return {manifest_io.verify(p, checksums=False).step: p for p in paths}
    ours, theirs = by_step(original), by_step(rerun)
    for step in sorted(set(ours) & set(theirs)):
        report = diff_checkpoints(ours[step], theirs[step])
        differing = [f for f in report.files if not f.identical]
        if differing or not report.identical:
            first = differing[0] if differing else None
            return {"step": step,
                    "tensor": f"{first.file}:{first.first_difference}" if first else "file sets differ",
                    "max_abs_diff": first.max_abs_diff if first else float("inf")}
    return None


def compare_runs(original_trace: Path, rerun_trace: Path, original_final: Path | None,
                 rerun_final: Path | None, *, original_checkpoints: list[Path] = (),
                 rerun_checkpoints: list[Path] = (), environments: tuple | None = None) -> Verdict:
    """`environments`: (original, re-run) fingerprints, compared whatever the outcome."""
    divergence, steps = compare_traces(read_trace(original_trace), read_trace(rerun_trace))
    verdict = Verdict(reproduced=divergence is None, first_divergence=divergence, steps_compared=steps)
    if environments is not None:
        verdict.environment_differences = fingerprint.differences(*environments)
    if original_final is not None and rerun_final is not None:
        report = diff_checkpoints(original_final, rerun_final)
        verdict.checkpoint_identical = report.identical
        verdict.checkpoint_first_difference = next(
            (f"{f.file}:{f.first_difference}" for f in report.files if not f.identical), None)
        verdict.reproduced = verdict.reproduced and report.identical
        verdict.notes += report.notes
    if not verdict.reproduced and original_checkpoints and rerun_checkpoints:
        verdict.first_differing_checkpoint = first_differing_checkpoint(
            list(original_checkpoints), list(rerun_checkpoints))
    return verdict
