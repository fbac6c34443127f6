"""Where the bench talks: progress on stderr, one line at a time; stdout keeps only the
table, even when a library or a process it spawns prints."""
from __future__ import annotations

import contextlib
import logging
import os
import sys


def progress(line: str) -> None:
    print(f"[bench] {line}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def stdout_to_stderr():
    """Send file descriptor 1 to stderr for the block: DeepSpeed prints checkpoint chatter
    to stdout, and processes spawned inside the block inherit the redirection for life."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def quiet_libraries() -> None:
    """DeepSpeed logs every checkpoint file at INFO; the bench reports its own lines."""
    for name in ("DeepSpeed", "deepspeed", "torch.distributed.checkpoint"):
        logging.getLogger(name).setLevel(logging.WARNING)


def one_line(exc: BaseException) -> str:
    """The exception as one line; a method's own `Unavailable` is already a reason."""
    text = " ".join(str(exc).split()) or "(no message)"
    if type(exc).__name__ == "Unavailable":
        return text[:300]
    return f"{type(exc).__name__}: {text[:300]}"


def gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.3g} GB"
