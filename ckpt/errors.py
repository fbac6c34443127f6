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


class ReshardError(CheckpointError):
    """A checkpoint could not be converted to the requested layout."""


class ReshardUnsupported(ReshardError):
    """DeepSpeed (or this machine) cannot do this layout transform; names both layouts and why."""

    def __init__(self, path, source: dict, target: dict, why: str):
        self.source, self.target = dict(source), dict(target)
        super().__init__(path, f"cannot reshard world_size={source.get('world_size')} zero_stage="
                         f"{source.get('zero_stage')} -> world_size={target.get('world_size')} "
                         f"zero_stage={target.get('zero_stage')}: {why}")


class ReshardNotEquivalent(ReshardError):
    """The converted checkpoint does not reproduce the source; no DST was committed."""

    def __init__(self, src, dst, details: dict):
        self.src, self.dst, self.details = str(src), str(dst), dict(details)
        failed = ", ".join(k for k, ok in details.get("checks", {}).items() if not ok)
        super().__init__(dst, f"resharded checkpoint of {self.src} is not equivalent to it "
                         f"(failed: {failed or 'unknown'}); nothing was committed at {self.dst}. "
                         f"Details: {details}")
