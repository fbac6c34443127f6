"""Where checkpoints live: `<run.dir>/<stage>/checkpoints/step-NNNNNN/` and `latest`."""
from __future__ import annotations

import re
from pathlib import Path

LATEST = "latest"
TMP_SUFFIX = ".tmp"
# A checkpoint being deleted is first renamed to step-N.deleting (see ckpt.commit.discard).
DELETING_SUFFIX = ".deleting"
MANIFEST = "manifest.json"
# step-000010 at an optimizer-step boundary; step-000010-micro-01 when a preemption
# saved mid-accumulation (one micro-batch of step 11 already accumulated).
_STEP_DIR = re.compile(r"^step-(\d{6,})(?:-micro-(\d+))?$")


def stage_dir(run_dir: str | Path, stage: str) -> Path:
    return Path(run_dir) / stage


def checkpoints_dir(run_dir: str | Path, stage: str) -> Path:
    return stage_dir(run_dir, stage) / "checkpoints"


def step_dirname(step: int, micro_in_window: int = 0) -> str:
    name = f"step-{step:06d}"
    return f"{name}-micro-{micro_in_window:02d}" if micro_in_window else name


def position_of(path: str | Path) -> tuple[int, int] | None:
    """(step, micro-steps into the next step) of a checkpoint directory name."""
    match = _STEP_DIR.match(Path(path).name)
    return (int(match.group(1)), int(match.group(2) or 0)) if match else None


def step_of(path: str | Path) -> int | None:
    position = position_of(path)
    return position[0] if position else None


def committed_steps(root: Path) -> list[Path]:
    """Committed step directories under `root`, oldest first (tmp dirs excluded)."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and step_of(p) is not None
             and (p / MANIFEST).is_file()]
    return sorted(found, key=position_of)


def read_latest(root: Path) -> Path | None:
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    return root / pointer.read_text().strip()


def resolve_resume(resume: str | None, root: Path) -> Path | None:
    """`latest` -> the committed checkpoint `latest` points to (None if none yet)."""
    if resume is None:
        return None
    if resume == "latest":
        return read_latest(root)
    return Path(resume).resolve()


def referenced_path(directory: str | Path, rel: str, entry: dict) -> Path:
    """Where a file a manifest references lives (selective persistence): in the named
    sibling checkpoint; `ckpt.confine.reference_problems` confines both names on read."""
    return Path(directory).parent / entry["checkpoint"] / rel
