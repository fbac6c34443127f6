"""Workers die with their launcher, whatever kills it (SIGKILL included).

The chain is baton -> torchrun agent -> workers, and torchrun starts every worker in a
session of its own: a signal to baton's process group never reaches them, and once
orphaned they would keep training and committing checkpoints into a directory whose
lock their owner no longer holds. Two mechanisms, in the agent and in every worker:

- `prctl(PR_SET_PDEATHSIG, SIGKILL)`: the kernel kills the process the moment its
  parent exits. It is tied to the parent *thread* (in `baton run` the launcher is a
  Prefect task thread) and is missed when the parent died before the child set it
  (a worker spends seconds importing first), so it is not relied on alone;
- a watchdog thread that watches each process of the chain above it (passed down in
  BATON_LIFELINE as `pid:start-ticks`, so that a reused pid is not taken for the
  launcher) through pidfds, which wake it the moment one exits, and checks them and its
  own parent pid at least every POLL_SECONDS; it `os._exit`s when one of them is gone.

The launcher also writes a random nonce into launch.json and passes it down as
BATON_LAUNCH_NONCE: a worker refuses a launch file that another launcher rewrote.

`python -m stages.launch_agent TORCHRUN-ARGS` (what `torchrun_command` returns) is the
agent between a launcher and its workers, with both in place; each worker ties itself to
the chain as any worker does.
"""
from __future__ import annotations

import ctypes
import json
import os
import secrets
import select
import signal
import sys
import threading
import time
from pathlib import Path

from core import processes
from core.errors import BatonError

ENV_CHAIN, ENV_NONCE = "BATON_LIFELINE", "BATON_LAUNCH_NONCE"
POLL_SECONDS = 0.5
PR_SET_PDEATHSIG = 1
EXIT_CODE = 70


class LaunchFileNotOurs(BatonError):
    """The launch file's nonce is not the one this worker's launcher passed down."""

    def __init__(self, path, found, expected: str):
        self.path, self.found, self.expected = str(path), found, expected
        super().__init__(
            f"{self.path} belongs to another launch (its nonce {str(found)[:8]}… is not this "
            f"launcher's {expected[:8]}…): another baton process rewrote it after this one "
            "started, and its workers would train with that run's config. Nothing was trained; "
            "run one baton per run directory and stage (see docs/security.md)")


# -- launcher side -----------------------------------------------------------------------

def write_launch_file(path: Path, payload: dict) -> dict[str, str]:
    """Write launch.json with a fresh nonce (atomically: a reader never sees half of it);
    return the environment the launch command must add."""
    nonce = secrets.token_hex(16)
    staging = path.with_name(path.name + ".tmp")
    staging.write_text(json.dumps({**payload, "nonce": nonce}, indent=1))
    os.replace(staging, path)
    return {ENV_NONCE: nonce, ENV_CHAIN: processes.current().token()}


def torchrun_command(nproc: int, module: str, launch_file: Path,
                     rendezvous: list[str] | None = None) -> list[str]:
    """`rendezvous`: torchrun's node arguments (stages.nodes); default one standalone node."""
    rendezvous = rendezvous or ["--standalone", f"--nproc-per-node={nproc}"]
    # stages.lean_start: the workers import DeepSpeed without its optional mlflow import.
    # -u: the workers' step records reach the launcher as they are printed (torchrun runs
    # its workers with -u; forked ones inherit the agent's streams).
    return [sys.executable, "-u", "-m", "stages.launch_agent", *rendezvous, "-m", "stages.lean_start",
            module, str(launch_file)]


# -- agent and worker side ---------------------------------------------------------------

def worker_start(launch_path: str | Path) -> dict:
    """First thing a worker does: tie itself to its launcher, then read the launch file
    and check that it is the one its launcher wrote."""
    hold()
    launch = json.loads(Path(launch_path).read_text())
    expected = os.environ.get(ENV_NONCE)
    if expected is not None and launch.get("nonce") != expected:
        raise LaunchFileNotOurs(launch_path, launch.get("nonce"), expected)
    return launch


def hold() -> None:
    """Die with the chain above this process; add this process to the chain its own
    children inherit. Without BATON_LIFELINE (started by hand) there is nothing to hold."""
    watch = join_chain()
    if watch is not None:
        watch()


def join_chain():
    """`hold()` without its watchdog thread: the kernel's tie and the check, now. Returns
    the function that starts the watchdog (None without a chain), for a process that must
    fork before it has a second thread (stages.fork_agent)."""
    token = os.environ.get(ENV_CHAIN)
    if not token:
        return None
    chain = [processes.ProcessIdentity.from_token(t) for t in token.split(",")]
    parent = chain[-1].pid
    _die_with_parent()
    reason = _gone(chain, parent)
    if reason:
        _exit(reason)
    os.environ[ENV_CHAIN] = f"{token},{processes.current().token()}"
    return lambda: threading.Thread(target=_watch, args=(chain, parent), name="baton-lifeline",
                                    daemon=True).start()


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return  # the watchdog alone
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _gone(chain: list[processes.ProcessIdentity], parent: int) -> str | None:
    if os.getppid() != parent:
        return f"its parent (pid {parent}) has exited"
    for identity in chain:
        if not identity.alive():
            return f"its launcher (pid {identity.pid}) has exited"
    return None


def _watch(chain: list[processes.ProcessIdentity], parent: int) -> None:
    exits = _exit_poller(chain)
    while True:
        if exits is None:
            time.sleep(POLL_SECONDS)
        else:
            exits.poll(POLL_SECONDS * 1000)  # wakes at once when one of them exits
        reason = _gone(chain, parent)
        if reason:
            _exit(reason)


def _exit_poller(chain: list[processes.ProcessIdentity]):
    """A poll object that becomes readable when a process of the chain exits (pidfds), or
    None where pidfds are missing. A pid reused since the chain was written is caught by
    `_gone`, which runs after every wake."""
    if not hasattr(os, "pidfd_open"):
        return None
    poller = select.poll()
    for identity in chain:
        try:
            poller.register(os.pidfd_open(identity.pid), select.POLLIN)
        except OSError:
            pass  # already gone: `_gone` says so at once
    return poller


def _exit(reason: str) -> None:
    # os.write, not print: the main thread may hold sys.stderr's lock.
    os.write(2, f"[baton] pid {os.getpid()} exits: {reason}; no orphan may keep training "
                f"or writing checkpoints\n".encode())
    os._exit(EXIT_CODE)


def single_worker_environment() -> dict[str, str]:
    """What torchrun's agent sets for rank 0 of a world of one (torch.distributed.run)."""
    from core.loopback import free_port

    port = free_port()  # rank 0 hosts its store here (on 127.0.0.1: core.loopback)
    one = {name: "1" for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE",
                                  "ROLE_WORLD_SIZE")}
    zero = {name: "0" for name in ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK",
                                   "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")}
    return {**one, **zero, "ROLE_NAME": "default", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": secrets.token_hex(8)}

