"""Checkpoint errors. Each names the path and what is wrong with it."""
from __future__ import annotations

from baton.errors import BatonError


class CheckpointError(BatonError):
    def __init__(self, path, message: str):
        self.path = str(path)
        super().__init__(f"{self.path}: {message}")


class NotACheckpoint(CheckpointError):
    """No committed checkpoint at the path (missing directory or manifest, or uncommitted)."""


class CorruptCheckpoint(CheckpointError):
    """Files differ from the manifest, or required components are missing."""

    def __init__(self, path, problems: list[str]):
        self.problems = list(problems)
        body = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(path, f"checkpoint is damaged; nothing was loaded:\n{body}")


class IncompatibleCheckpoint(CheckpointError):
    """A sound checkpoint that this run cannot load as it is (model or layout differs)."""
