"""One owner per run directory and stage: an exclusive lock held for the life of the run.

`baton stage` and every stage launch hold `<stage dir>/stage.lock`; `baton run` holds
`<run.dir>/run.lock`; `baton ckpt gc` holds the stage's lock while it deletes. The lock
is `fcntl.flock`, which the kernel drops when its holder dies however it dies (SIGKILL
included), so no dead owner can keep a directory locked. The file also carries a JSON
holder record (pid, host, start time, command) that the refusal message quotes; a record
found in a lock that is free was left by an owner that died without releasing it, and
is taken over with a line that says so.

The descriptor is close-on-exec and never passed to torchrun or the workers: if they
held it, a dead launcher's lock would live on in its workers (which stages.lifeline
stops anyway). The lock file is never deleted: unlinking a flock file lets two
processes lock two different files under one name.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator, Optional

from core import processes
from core.errors import BatonError

STAGE_LOCK, RUN_LOCK = "stage.lock", "run.lock"
# What the refusal means and the fix; `{stop}` names the holder's process.
DID_NOT_START = ("Two runs on one directory would mix their checkpoints, metrics and launch "
                 "files, so this one did not start. Wait for that run to finish, {stop}, or "
                 "give this run its own run.dir.")
_RECORD_READS = 10  # a holder writes its record right after locking; wait that long for it

_registry_guard = threading.Lock()
_held: dict[str, tuple[int, int]] = {}  # path -> (fd, owning thread): this process's locks


class RunDirectoryBusy(BatonError):
    """Another process holds the lock: names it (pid, host, start time) and the fix."""

    def __init__(self, path, what: str, holder: Optional[dict], refused: str = DID_NOT_START):
        self.path, self.what, self.holder, self.refused = str(path), what, holder, refused
        if holder and "pid" in holder:
            pid, host = holder["pid"], holder.get("host", "?")
            who = f"pid {pid} on host {host} ({describe(holder)})"
            stop = f"stop it (`kill {pid}` on {host})"
        else:
            who, stop = "another process (its holder record is not written yet)", "stop it"
        super().__init__(
            f"{what} is in use: {self.path} is held by {who}. " + refused.format(stop=stop))


def describe(holder: dict) -> str:
    return f"started {holder.get('started') or 'at an unknown time'}; command: {holder.get('command', '?')}"


def stage_lock(stage_directory: Path, refused: str = DID_NOT_START,
               node: int = 0) -> contextlib.AbstractContextManager:
    """The lock of one stage directory (`<run.dir>/<stage>`); node K > 0 of a multi-node
    launch holds `stage-node-K.lock` (each node's launcher owns its own files there)."""
    name = f"stage-node-{node}.lock" if node else STAGE_LOCK
    return hold(Path(stage_directory) / name, f"stage directory {stage_directory}"
                + (f" (node {node})" if node else ""), refused)


def run_lock(run_dir: Path) -> contextlib.AbstractContextManager:
    """The lock of a whole run directory, held by `baton run` for the pipeline."""
    return hold(Path(run_dir) / RUN_LOCK, f"run directory {run_dir}")


@contextlib.contextmanager
def hold(path: Path, what: str, refused: str = DID_NOT_START) -> Iterator[None]:
    """Hold the lock at `path` until the block ends. Re-entrant within one thread (the
    `baton stage` command and the launch it calls take the same lock); another thread of
    this process is refused like any other process."""
    key = str(Path(path).resolve())
    me = threading.get_ident()
    with _registry_guard:
        held = _held.get(key)
    if held is not None:
        if held[1] != me:
            raise RunDirectoryBusy(path, what, _holder_record(held[0]), refused)
        yield  # the outer `hold` of this thread releases it
        return
    fd = _acquire(Path(path), what, refused)
    with _registry_guard:
        _held[key] = (fd, me)
    try:
        yield
    finally:
        with _registry_guard:
            del _held[key]
        _release(fd)


def _acquire(path: Path, what: str, refused: str) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder_record(fd)
        os.close(fd)
        raise RunDirectoryBusy(path, what, holder, refused) from None
    except BaseException:
        os.close(fd)
        raise
    stale = _read_record(fd)
    if stale:
        print(f"[baton] {path}: taking over the lock left by pid {stale.get('pid', '?')} on host "
              f"{stale.get('host', '?')} ({describe(stale)}), which is no longer running",
              flush=True)
    _write_record(fd, _my_record())
    return fd


def _release(fd: int) -> None:
    """Clear the record first: an empty file is the sign of a clean release."""
    try:
        os.ftruncate(fd, 0)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _my_record() -> dict:
    from core.config.secrets import redact_text

    me = processes.current()
    started = me.started_at()
    argv0 = sys.argv[0] if sys.argv else ""
    program = {"": "python", "-c": "python -c"}.get(argv0, Path(argv0).name)
    if program in ("cli.py", "__main__.py"):  # python -m baton.cli
        program = "baton"
    return {"pid": me.pid, "host": me.host, "start_ticks": me.start_ticks,
            "started": started.strftime("%Y-%m-%d %H:%M:%S UTC") if started else None,
            "command": redact_text(" ".join([program, shlex.join(sys.argv[1:])]).strip()),
            "acquired": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")}


def _write_record(fd: int, record: dict) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode(), 0)
    os.fsync(fd)


def _read_record(fd: int) -> Optional[dict]:
    """The record in the file; None if empty; `{}` if unreadable (a torn write)."""
    data = os.pread(fd, 1 << 16, 0)
    if not data.strip():
        return None
    try:
        record = json.loads(data)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def _holder_record(fd: int) -> Optional[dict]:
    """The live holder's record, waiting briefly if it has only just taken the lock."""
    for _ in range(_RECORD_READS):
        record = _read_record(fd)
        if record:
            return record
        time.sleep(0.05)
    return None
