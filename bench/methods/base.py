"""The contract every measured method follows, so the harness times them all alike.

The harness calls `prepare` once, then per round: `save` and `before_update` (timed: the
stall, until training may change the state), `wait_durable` (timed from the same start:
until the bytes are on stable storage), `saved_bytes`, `cleanup`; and `close` at the end. A method that cannot start
here raises `Unavailable` from `prepare` (or any exception: its text is the reason).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

ANCHOR_DEEPSPEED = "deepspeed default (torch.save)"
ANCHOR_DCP_ASYNC = "dcp async_save (reused stager)"


class Unavailable(Exception):
    """The method does not run on this machine; the message says why, in one line."""


class SaveMethod:
    name: str = ""
    bound: bool = False
    """A bound (memcpy, raw write) rather than a checkpoint method."""
    isolated: bool = False
    """Keeps a writer process busy between saves (DeepSpeed's decoupled engine, DCP's
    process-based async_save): measured alone, after the interleaved methods, and closed
    at once, so its background work does not slow the others down."""

    def __init__(self):
        self.state = None
        self.directory: Path | None = None
        self.saves = 0
        self.last: Path | None = None

    def prepare(self, state, directory: Path) -> None:
        self.state, self.directory = state, Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def next_path(self) -> Path:
        """A fresh file or directory name for the next save."""
        self.saves += 1
        self.last = self.directory / f"save-{self.saves}"
        return self.last

    def save(self) -> None:
        raise NotImplementedError

    def before_update(self) -> None:
        """What the next optimizer step waits for (baton's lazy staging copy); default:
        nothing, `save` returned once the state could change."""

    def wait_durable(self) -> None:
        """Default: `save` already made the bytes durable."""

    def saved_bytes(self) -> int:
        return tree_bytes(self.last) if self.last is not None else 0

    def cleanup(self) -> None:
        """Remove the last save's files: a bench writes many GB."""
        if self.last is not None:
            remove(self.last)

    def close(self) -> None:
        """Release buffers, threads and processes."""

    def children(self) -> list[int]:
        """Processes whose memory counts toward this method's (a background writer)."""
        return []


def tree_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists():
        path.unlink()


def fsync_tree(path: Path) -> None:
    """fsync every file under `path`, then the directories: for writers that leave
    durability to the page cache, so their time until durable can be measured."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for directory in {f.parent for f in files} | ({path} if path.is_dir() else set()):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
