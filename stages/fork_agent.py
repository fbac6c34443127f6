"""Several workers on one node: import their libraries once, then fork them.

torchrun's agent starts each worker as a fresh interpreter, and each one imports torch,
DeepSpeed and transformers again (about 4 s of CPU apiece here) before it computes
anything. On one node (`--standalone`) with no restarts there is nothing else the
agent is needed for, so `stages.launch_agent` hands such launches to this module: it does
what `stages.lean_start` does in each worker (DeepSpeed imported without mlflow, stores
bound to the launch's address) once, imports the worker module and the model families'
modules (stages.warm_image), and forks the ranks from that image. The forked ranks are
the same code, with the same variables torchrun would give them, and torchrun's failure
contract is kept:

- each rank runs in a session of its own (a terminal's Ctrl-C reaches the launcher,
  which stops the launch in order);
- a Python exception a rank records (`@record`) is copied to the agent's
  TORCHELASTIC_ERROR_FILE, and the first failure is reported on stderr in torchrun's
  "Root Cause (first observed failure)" form, which `stages.worker_output` reads;
- when one rank fails the others get SIGTERM, then SIGKILL after GRACE_SECONDS;
- SIGTERM, SIGINT or SIGHUP to the agent is passed on to every rank, and the agent
  waits for them (a preempted stage still saves).

Forking is safe here because the agent has run no torch operation and started no
thread before it forks: no thread pool or lock is copied half-held.
"""
from __future__ import annotations

import json
import os
import runpy
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

from core.loopback import free_port

GRACE_SECONDS = 30.0  # torchrun's own wait before SIGKILL
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def run(nproc: int, command: list[str], arm_watchdog) -> None:
    """`command`: `stages.lean_start MODULE ARGS...` (what torchrun would run with -m).
    `arm_watchdog`: starts the agent's lifeline thread (after the forks: a thread must
    not exist when a rank is forked). Exits with 0 when every rank did, else 1."""
    if command[0] != "stages.lean_start":
        raise ValueError(f"the fork agent runs stages.lean_start modules, not {command[0]}")
    module, argv = command[1], command[1:]
    if nproc > 1:
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # as torchrun: read when torch loads
    _prepare(module)
    errors = Path(tempfile.mkdtemp(prefix="baton-ranks-"))
    shared = _shared_environment(nproc)
    ranks = {}
    for rank in range(nproc):
        env = {**shared, **_rank_environment(rank), "TORCHELASTIC_ERROR_FILE": str(errors / f"{rank}.json")}
        ranks[_fork(module, argv, env)] = rank
    arm_watchdog()
    code = _supervise(ranks, errors)
    shutil.rmtree(errors, ignore_errors=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _prepare(module: str) -> None:
    # Every rank's imports, its model family's included, land in the image once.
    from stages import warm_image

    warm_image.load((module,))


def _shared_environment(nproc: int) -> dict[str, str]:
    """What torchrun's agent gives every worker of a one-node launch (rank 0 hosts the
    store: no agent store here)."""
    port = free_port()  # on 127.0.0.1: core.loopback binds the store there
    size = str(nproc)
    return {"WORLD_SIZE": size, "LOCAL_WORLD_SIZE": size, "GROUP_WORLD_SIZE": "1",
            "ROLE_WORLD_SIZE": size, "GROUP_RANK": "0", "ROLE_NAME": "default",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
            "TORCHELASTIC_RUN_ID": secrets.token_hex(8), "TORCHELASTIC_USE_AGENT_STORE": "False"}


def _rank_environment(rank: int) -> dict[str, str]:
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "ROLE_RANK": str(rank)}


def _fork(module: str, argv: list[str], env: dict[str, str]) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    # The rank. It never returns into the agent: the module's exit (or its exception,
    # printed as Python prints any) ends this process as it would end a fresh one.
    os.setsid()
    os.environ.update(env)
    sys.argv = list(argv)
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    sys.exit(0)


def _supervise(ranks: dict[int, int], errors: Path) -> int:
    """Wait for every rank; on the first failure stop the others. The exit code."""
    live, failure = dict(ranks), None
    deadline = None

    def forward(number, _frame):
        for pid in live:
            _signal(pid, number)
    for number in FORWARDED:
        signal.signal(number, forward)
    while live:
        pid, status = _wait(deadline)
        if pid is None:  # the grace period after a failure is over
            for other in live:
                _signal(other, signal.SIGKILL)
            deadline = None
            continue
        rank = live.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        if code != 0 and failure is None:
            failure = (rank, pid, code)
            for other in live:
                _signal(other, signal.SIGTERM)
            deadline = time.monotonic() + GRACE_SECONDS
    if failure is None:
        return 0
    _report(*failure, errors)
    return 1


def _wait(deadline: float | None) -> tuple[int | None, int]:
    """The next rank to exit; (None, 0) once `deadline` passes first."""
    while True:
        pid, status = os.waitpid(-1, 0 if deadline is None else os.WNOHANG)
        if pid:
            return pid, status
        if time.monotonic() >= deadline:
            return None, 0
        time.sleep(0.05)


def _signal(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except ProcessLookupError:
        pass


def _report(rank: int, pid: int, code: int, errors: Path) -> None:
    """torchrun's root-cause block (stages.worker_output reads it), and the rank's
    recorded exception copied where the launcher looks for it."""
    error_file = errors / f"{rank}.json"
    target = os.environ.get("TORCHELASTIC_ERROR_FILE")
    recorded = error_file.is_file()
    if recorded and target:
        try:
            Path(target).write_text(json.dumps(json.loads(error_file.read_text())))
        except (OSError, ValueError):
            recorded = False
    if code < 0:
        try:
            cause = f"Signal {-code} ({signal.Signals(-code).name}) received by PID {pid}"
        except ValueError:
            cause = f"Signal {-code} received by PID {pid}"
    else:
        cause = f"see the rank's output above (error file: {error_file if recorded else 'none'})"
    print("baton's fork agent: a worker failed\n"
          "Root Cause (first observed failure):\n[0]:\n"
          f"  time      : {time.strftime('%Y-%m-%d_%H:%M:%S')}\n"
          f"  host      : {socket.gethostname()}\n"
          f"  rank      : {rank} (local_rank: {rank})\n"
          f"  exitcode  : {code} (pid: {pid})\n"
          f"  traceback : {cause}", file=sys.stderr, flush=True)
