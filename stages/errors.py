"""Errors a stage reports to the user about what it was given. Each carries its data."""
from __future__ import annotations

from core.errors import BatonError


class WrongModelCheckpoint(BatonError):
    """A frozen helper model (RL reference or reward model) given a checkpoint of another
    model: it lacks parameters the model has."""

    def __init__(self, path, role: str, missing: list[str], model: str, expected: str):
        self.path, self.role, self.missing = str(path), role, list(missing)
        self.model, self.expected = model, expected
        super().__init__(f"stage.{role}_from={path}: the checkpoint lacks {self.missing} of "
                         f"{model}; expected a checkpoint of that model (a '{expected}' stage "
                         "checkpoint)")


class KlStateMismatch(BatonError):
    """A checkpoint's KL controller is another kind than the one this run configures."""

    def __init__(self, found: str, expected: str):
        self.found, self.expected = found, expected
        super().__init__(f"KL controller state is {found!r}, this run uses {expected!r}; keep "
                         "stage.kl_target as it was when the checkpoint was saved")


class StageFailed(BatonError):
    """`infrastructure`: the workers died without a Python error (killed, lost rendezvous);
    only those failures are worth retrying. `cause`: what a worker reported, in its words."""

    def __init__(self, stage: str, returncode: int, log_hint: str, infrastructure: bool = False,
                 cause: str | None = None, reason: str | None = None):
        self.stage, self.returncode, self.infrastructure = stage, returncode, infrastructure
        self.cause = cause
        if cause:
            super().__init__(f"stage '{stage}' failed: {cause}. ({log_hint})")
            return
        kind = (f"{reason or 'killed, out of memory or lost rendezvous'}: an infrastructure "
                "failure" if infrastructure else "error in the stage")
        super().__init__(f"stage '{stage}' workers exited with code {returncode} without a "
                         f"result ({kind}); {log_hint}")
