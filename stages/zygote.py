"""A warm process: stage workers forked from one import of their libraries.

`python -u -m stages.zygote SOCKET`, started by the fork server (stages.fork_server) with
the environment of the launches it will take, loads stages.warm_image and listens on
SOCKET. A launch (stages.warm_launch) sends its command, working directory, umask and
environment, with its standard streams; the zygote forks a child that takes them on and
runs the command as `stages.launch_agent` runs it after its exec (one worker) or in its fork
agent (several ranks), or, for a plain process (a Ray worker of the RL roles:
stages.rl.warm_worker), as `python -m` would; it replies with the child's pid and,
once it has exited, its exit status.

Why a child is the worker a fresh interpreter would have been:
- the zygote's environment is the launch's but for variables read only at run time
  (stages.fork_server.VOLATILE): a launch with other import-time settings (repro mode's
  kernel pins, thread counts) gets another zygote, never this one;
- the zygote has started no thread and run no torch operation; that it is still one
  thread is checked before every fork, and a launch it refuses starts cold;
- the child runs in a session of its own with the launch's streams, directory, umask
  and environment, and joins the launch's lifeline chain with this zygote as its parent
  (stages.lifeline): it dies with the launch's process, as a cold worker does.
"""
from __future__ import annotations

import json
import os
import runpy
import selectors
import socket
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from core import processes
from stages import fork_wire, warm_image
from stages.fork_server import FORKS_LOG, IMPORT_DEFAULTS
from stages.lifeline import ENV_CHAIN, hold, join_chain, single_worker_environment

STREAMS = 3  # stdin, stdout, stderr


@dataclass
class Launch:
    connection: socket.socket
    streams: list[int]
    command: list[str]
    """`stages.lean_start MODULE ARGS...`, as stages.launch_agent would run it; for a
    PROCESS launch, `MODULE ARGS...` run as `python -m` would."""
    nproc: int
    cwd: str
    umask: int
    env: dict[str, str]
    kind: str = fork_wire.TORCHRUN


def main(argv: list[str]) -> None:
    path = Path(argv[0])
    join_chain()  # dies with the fork server; no watchdog thread: this process forks
    with _stdout_on_stderr():
        warm_image.load()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(64)
    print("ready", flush=True)
    job = _serve(listener, path.parent / FORKS_LOG)
    job()  # only in a forked child, with nothing of the loop on the stack: never returns


@contextmanager
def _stdout_on_stderr():
    """What the libraries print while they load goes to the server's log (stderr), never
    before "ready" on stdout, which the server reads as the first line (DeepSpeed says on
    stdout which accelerator it picked where DS_ACCELERATOR is unset)."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _serve(listener: socket.socket, log: Path):
    """Fork a child for every launch, report each child's exit; in a child, return the
    launch to run."""
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    running: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, the launch's connection)
    me = processes.current().token()
    while True:
        for key, _ in selector.select():
            if key.fileobj is not listener:
                _report_exit(selector, key.fd, running)
                continue
            launch = _accept(listener)
            if launch is None:
                continue
            threads = warm_image.thread_count()
            if threads != 1:
                _refuse(launch, f"the warm process has {threads} threads; a fork could copy a held lock")
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _leave(selector, listener, running, launch)
                return lambda: _run(launch, me)
            _started(selector, running, launch, pid, log)


def _accept(listener: socket.socket) -> Launch | None:
    connection, _ = listener.accept()
    try:
        request, streams = fork_wire.receive(connection, STREAMS)
    except (OSError, ValueError):
        request, streams = None, []
    if request is None or len(streams) != STREAMS:
        for fd in streams:
            os.close(fd)
        connection.close()
        return None
    return Launch(connection, streams, **request)


def _refuse(launch: Launch, reason: str) -> None:
    for fd in launch.streams:
        os.close(fd)
    try:
        fork_wire.send(launch.connection, {"refused": reason})
    except OSError:
        pass
    launch.connection.close()


def _started(selector, running, launch: Launch, pid: int, log: Path) -> None:
    for fd in launch.streams:  # the child holds them now: the launch sees EOF when it exits
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    selector.register(pidfd, selectors.EVENT_READ)
    running[pidfd] = (pid, launch.connection)
    try:
        fork_wire.send(launch.connection, {"pid": pid})
    except OSError:
        pass  # the launch is gone; its worker follows it (stages.lifeline)
    module = launch.command[0 if launch.kind == fork_wire.PROCESS else 1]
    record = {"pid": pid, "zygote": os.getpid(), "module": module,
              "nproc": launch.nproc, "chain": launch.env.get(ENV_CHAIN), "at": time.time()}
    with open(log, "a") as handle:
        handle.write(json.dumps(record) + "\n")


def _report_exit(selector, pidfd: int, running) -> None:
    pid, connection = running.pop(pidfd)
    selector.unregister(pidfd)
    os.close(pidfd)
    _, status = os.waitpid(pid, 0)
    try:
        fork_wire.send(connection, {"exit": os.waitstatus_to_exitcode(status)})
    except OSError:
        pass
    connection.close()


def _leave(selector, listener: socket.socket, running, launch: Launch) -> None:
    """In the child: let go of everything that is the zygote's."""
    selector.close()
    listener.close()
    for pidfd, (_, connection) in running.items():
        os.close(pidfd)
        connection.close()
    launch.connection.close()


def _run(launch: Launch, zygote: str) -> None:
    """The launch, in the forked child, as stages.launch_agent would run it."""
    os.setsid()
    for target, fd in enumerate(launch.streams):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(launch.cwd)
    os.umask(launch.umask)
    os.environ.clear()
    os.environ.update(launch.env)
    for name, value in IMPORT_DEFAULTS.items():  # as the worker's own imports would set them
        os.environ.setdefault(name, value)
    # The launch's chain, with this zygote as the child's parent (stages.lifeline).
    os.environ[ENV_CHAIN] = ",".join(filter(None, (launch.env.get(ENV_CHAIN), zygote)))
    if launch.kind == fork_wire.PROCESS:
        hold()  # nothing in a Ray worker ties it to the chain: this does, before it runs
        sys.argv = launch.command
        runpy.run_module(launch.command[0], run_name="__main__", alter_sys=True)
        sys.exit(0)
    if launch.nproc == 1:
        os.environ.update(single_worker_environment())
        sys.argv = launch.command[1:]
        runpy.run_module(launch.command[1], run_name="__main__", alter_sys=True)
        sys.exit(0)
    from stages import fork_agent

    watch = join_chain()
    fork_agent.run(launch.nproc, launch.command, watch or (lambda: None))


if __name__ == "__main__":
    main(sys.argv[1:])
