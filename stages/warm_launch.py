"""A one-node launch taken by a warm process (stages.fork_server) instead of a fresh
interpreter.

`stages.launch_agent` calls `run` first for a `--standalone` launch. With the fork server's
variable in the environment, it asks the server for the warm process of this launch's
fingerprint, hands that process its command, directory, umask, environment and standard
streams, and then stands in for the worker: the launcher's pipes, signals and exit status
work as with the worker itself.

- SIGTERM, SIGINT and SIGHUP are passed on to the worker (a preempted stage saves);
- this process exits as the worker did: with its exit code, or killed by its signal;
- this process dies with its launcher (stages.lifeline) and the worker with this process:
  its lifeline chain holds this process, watched through a pidfd, so SIGKILL of the
  launcher ends the worker at once, as it ends a cold one.

Whenever the server cannot take the launch (no server, another interpreter, a warm
process that would not start), `run` returns and the launch starts cold.
"""
from __future__ import annotations

import os
import signal
import socket
import sys

from core import processes
from stages import fork_server, fork_wire
from stages.lifeline import ENV_CHAIN, EXIT_CODE, hold

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def run(argv: list[str], nproc: int) -> None:
    """`argv`: stages.launch_agent's (`--standalone --nproc-per-node=N -m stages.lean_start
    MODULE ARGS`). Returns only when the launch must start cold."""
    command = argv[argv.index("-m") + 1:] if "-m" in argv else []
    if command[:1] == ["stages.lean_start"]:
        take(command, nproc, fork_wire.TORCHRUN)


def take(command: list[str], nproc: int, kind: str) -> None:
    """Hand `command` to a warm process and stand in for it (stages.zygote says what it runs
    for each `kind`). Returns only when the launch must start cold."""
    control = os.environ.get(fork_server.ENV)
    if not control:
        return
    env = dict(os.environ)
    env[ENV_CHAIN] = ",".join(filter(None, (env.get(ENV_CHAIN), processes.current().token())))
    umask = os.umask(0)
    os.umask(umask)
    request = {"command": command, "nproc": nproc, "cwd": os.getcwd(), "umask": umask,
               "env": env, "kind": kind}
    try:
        warm = _ask(control, {"fingerprint": fork_server.fingerprint(env, os.getcwd())})
        if "socket" not in warm:
            return _cold(warm.get("refused", "no answer"))
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.connect(warm["socket"])
        fork_wire.send(connection, request, (0, 1, 2))
        reply, _ = fork_wire.receive(connection)
    except (OSError, ValueError) as exc:
        return _cold(str(exc))
    if not reply or "pid" not in reply:
        return _cold((reply or {}).get("refused", "the warm process closed the connection"))
    _follow(connection, reply["pid"])


def _ask(control: str, request: dict) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(control)
        fork_wire.send(sock, request)
        answer, _ = fork_wire.receive(sock)
    return answer or {}


def _cold(reason: str) -> None:
    print(f"[baton] fork server: {reason}; this launch starts its workers cold",
          file=sys.stderr, flush=True)


def _follow(connection: socket.socket, pid: int) -> None:
    """Stand in for worker `pid` until it exits, then exit as it did."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:  # already gone: its status is on the way
        pidfd = None

    def forward(number, _frame):
        if pidfd is not None:
            try:
                signal.pidfd_send_signal(pidfd, number)
            except ProcessLookupError:
                pass
    for number in FORWARDED:
        signal.signal(number, forward)
    hold()  # from here this process dies with its launcher, and the worker with it
    reply, _ = fork_wire.receive(connection)
    sys.stdout.flush()
    sys.stderr.flush()
    if not reply or "exit" not in reply:
        os.write(2, f"[baton] the warm process that forked worker pid {pid} ended before "
                    "the worker reported its exit\n".encode())
        os._exit(EXIT_CODE)
    _exit_as(reply["exit"])


def _exit_as(code: int) -> None:
    if code >= 0:
        os._exit(code)
    try:  # killed by a signal: so is this stand-in (SIGKILL's handler cannot be set)
        signal.signal(-code, signal.SIG_DFL)
    except (OSError, ValueError):
        pass
    os.kill(os.getpid(), -code)
    os._exit(128 - code)
