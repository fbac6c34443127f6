"""Where checkpoints live: `<run.dir>/<stage>/checkpoints/step-NNNNNN/` and `latest`."""
from __future__ import annotations

import re
from pathlib import Path

LATEST = "latest"
TMP_SUFFIX = ".tmp"
MANIFEST = "manifest.json"
_STEP_DIR = re.compile(r"^step-(\d{6,})$")


def stage_dir(run_dir: str | Path, stage: str) -> Path:
    return Path(run_dir) / stage


def checkpoints_dir(run_dir: str | Path, stage: str) -> Path:
    return stage_dir(run_dir, stage) / "checkpoints"


def step_dirname(step: int) -> str:
    return f"step-{step:06d}"


def step_of(path: str | Path) -> int | None:
    match = _STEP_DIR.match(Path(path).name)
    return int(match.group(1)) if match else None


def committed_steps(root: Path) -> list[Path]:
    """Committed step directories under `root`, oldest first (tmp dirs excluded)."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and step_of(p) is not None
             and (p / MANIFEST).is_file()]
    return sorted(found, key=step_of)


def read_latest(root: Path) -> Path | None:
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    return root / pointer.read_text().strip()
