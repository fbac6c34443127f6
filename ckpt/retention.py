"""Which committed checkpoints retention keeps, beside the newest `keep_last`.

- **The best k by a metric** (`KeepBest`): a stage that evaluates at its save steps can keep
  its lowest-loss or highest-reward checkpoints, however early they came; the newest ones
  are kept by `keep_last` as before. Each checkpoint carries the metrics of its step in
  `meta.json` (`metrics`); one saved at a step without that metric is kept by `keep_last`
  alone. Ties go to the newer checkpoint.
- **Pinned checkpoints**: a handoff that chose a checkpoint, or a stage started from one,
  pins it (`pin`). Lineage then names it as the input of a later stage and `baton rerun`
  re-materialises it from there, so no retention ever deletes it, however long the stage
  it came from is resumed later. A pin is a file in the checkpoints directory's `.pins/`
  (one per reason, so two handoffs pinning at once never race), never a change to the
  committed checkpoint itself.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from ckpt.layout import step_of

META = "meta.json"
PINS = ".pins"
_SEPARATOR = "--"
MODES = ("min", "max")


@dataclass(frozen=True)
class KeepBest:
    k: int
    metric: str
    mode: str = "min"
    """min: lower is better (a loss); max: higher is better (a reward, an accuracy)."""


def metric_at(checkpoint: Path, metric: str) -> float | None:
    """The value of `metric` recorded with the checkpoint, or None (absent, not a finite
    number, or meta.json unreadable: such a checkpoint is not ranked)."""
    try:
        value = (json.loads((checkpoint / META).read_bytes()).get("metrics") or {}).get(metric)
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def best(steps: list[Path], rule: KeepBest) -> set[Path]:
    """The `rule.k` best of `steps` by `rule.metric`."""
    sign = 1.0 if rule.mode == "min" else -1.0
    scored = [(sign * value, -(step_of(path) or 0), path) for path in steps
              if (value := metric_at(path, rule.metric)) is not None]
    return {path for _, _, path in sorted(scored)[:max(rule.k, 0)]}


def pin(checkpoint: str | Path, why: str) -> Path:
    """Keep `checkpoint` from retention for good, saying why ("handoff sft_rl of pipeline
    run 1"). Idempotent for the same reason. Returns the pin's file."""
    checkpoint = Path(checkpoint)
    directory = checkpoint.parent / PINS
    directory.mkdir(exist_ok=True)
    tag = hashlib.sha256(why.encode()).hexdigest()[:12]
    target = directory / f"{checkpoint.name}{_SEPARATOR}{tag}.json"
    if not target.exists():
        tmp = target.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"checkpoint": checkpoint.name, "why": why}) + "\n")
        os.replace(tmp, target)
    return target


def pinned(root: Path) -> set[Path]:
    """The checkpoints under `root` that something pinned."""
    directory = Path(root) / PINS
    if not directory.is_dir():
        return set()
    return {Path(root) / entry.name.split(_SEPARATOR)[0] for entry in directory.iterdir()
            if entry.name.endswith(".json") and _SEPARATOR in entry.name}


def pins_of(checkpoint: Path) -> list[str]:
    """Why `checkpoint` is pinned (empty: it is not)."""
    directory = checkpoint.parent / PINS
    reasons = []
    for entry in sorted(directory.glob(f"{checkpoint.name}{_SEPARATOR}*.json")):
        try:
            reasons.append(str(json.loads(entry.read_text())["why"]))
        except (OSError, ValueError, KeyError, TypeError):
            reasons.append(f"(unreadable pin {entry.name})")
    return reasons
