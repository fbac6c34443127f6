"""A checkpoint directory as a user names it: a step directory or its `latest` pointer.

Users type the path they see in `checkpoints/`; resolving the pointer file here keeps
every command (verify, inspect, diff, export) reading the same directory for it.
"""
from __future__ import annotations

from pathlib import Path

from ckpt.errors import NotACheckpoint
from ckpt.layout import LATEST
from core.errors import UsageError


def named_checkpoint(value: str, argument: str = "PATH") -> Path:
    """A checkpoint directory named on the command line. The `latest` pointer file (what a
    user types after looking in checkpoints/) stands for the directory it names; an empty
    string is refused rather than read as the current directory."""
    if not value.strip():
        raise UsageError(argument, value, "an empty path; expected a checkpoint directory such "
                         "as <run.dir>/<stage>/checkpoints/step-000010, or its `latest` pointer")
    path = Path(value)
    if path.is_file() and path.name != LATEST:
        raise NotACheckpoint(path, "a file, not a checkpoint directory; pass the step-NNNNNN "
                             "directory that holds it (or the `latest` pointer beside them)")
    if not path.is_file():
        return path
    try:
        name = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise NotACheckpoint(path, f"unreadable `latest` pointer ({exc})") from None
    target = path.parent / name
    if not name or "/" in name or name in (".", "..") or not target.is_dir():
        raise NotACheckpoint(path, f"the `latest` pointer names {name!r}, which is not a "
                             f"checkpoint directory beside it; list {path.parent} to pick one")
    return target
