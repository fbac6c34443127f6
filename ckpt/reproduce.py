"""Did a re-run reproduce the original? Per-step trace first, then the final checkpoint."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ckpt.diff import diff_checkpoints

# Wall-clock fields differ between any two runs and say nothing about reproduction.
VOLATILE = {"seconds"}


@dataclass
class Verdict:
    reproduced: bool
    first_divergence: dict | None = None
    """{"step", "metric", "original", "rerun", "abs_diff"} of the first differing value."""
    checkpoint_identical: bool | None = None
    checkpoint_first_difference: str | None = None
    steps_compared: int = 0
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        if self.reproduced:
            return (f"REPRODUCED bit for bit: {self.steps_compared} steps of the trace and the final "
                    "checkpoint are identical")
        if self.first_divergence:
            d = self.first_divergence
            return (f"DIVERGED at step {d['step']}: {d['metric']} original {d['original']!r} vs re-run "
                    f"{d['rerun']!r} (|diff| = {d['abs_diff']:.3e})")
        return f"DIVERGED: final checkpoint differs first at {self.checkpoint_first_difference}"


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


def compare_runs(original_trace: Path, rerun_trace: Path, original_final: Path | None,
                 rerun_final: Path | None) -> Verdict:
    divergence, steps = compare_traces(read_trace(original_trace), read_trace(rerun_trace))
    verdict = Verdict(reproduced=divergence is None, first_divergence=divergence, steps_compared=steps)
    if original_final is not None and rerun_final is not None:
        report = diff_checkpoints(original_final, rerun_final)
        verdict.checkpoint_identical = report.identical
        verdict.checkpoint_first_difference = next(
            (f"{f.file}:{f.first_difference}" for f in report.files if not f.identical), None)
        verdict.reproduced = verdict.reproduced and report.identical
        verdict.notes += report.notes
    return verdict
