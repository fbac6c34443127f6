"""`python -m stages.rl.warm_worker DEFAULT_WORKER_PY ARGS...`: a Ray worker of the
RL roles, forked by a warm process of the fork server (stages.fork_server) instead of
started as a fresh interpreter.

A rollout or reward actor's process imports torch and a model family's transformers
modules before it loads its model: 4-5 s of CPU apiece on the machines this project runs
on, for every actor of every RL stage and again for every restart. The stage names this
module as the actors' interpreter (Ray's `py_executable`, stages.rl.launcher) when
its process has a fork server; Ray then starts `this ARGS...` where it would start
`python default_worker.py ARGS...`, and this process hands Ray's worker module and its
arguments to the warm process of its environment's fingerprint and stands in for the
worker (stages.warm_launch): Ray's signals reach the worker, and this process exits as
the worker did.

Lifelines (stages.lifeline): this process dies with the raylet that started it, and the
worker with this process. Where the server cannot take the launch (none reachable from
this node, another interpreter, a warm process that would not start) the worker starts
cold, exactly as Ray would have started it.
"""
from __future__ import annotations

import os
import sys

from core import processes
from stages import fork_wire, warm_launch
from stages.lifeline import ENV_CHAIN

RAY_WORKER_SCRIPT = "default_worker.py"
RAY_WORKER_MODULE = "ray._private.workers.default_worker"


def main(argv: list[str]) -> None:
    inherited = os.environ.get(ENV_CHAIN)
    parent = processes.identity_of(os.getppid())
    if argv and os.path.basename(argv[0]) == RAY_WORKER_SCRIPT and parent is not None:
        os.environ[ENV_CHAIN] = parent.token()  # the raylet: this process dies with it
        warm_launch.take([RAY_WORKER_MODULE, *argv[1:]], 1, fork_wire.PROCESS)
    # Cold: the worker Ray would have started, with Ray's environment.
    os.environ.pop(ENV_CHAIN, None)
    if inherited is not None:
        os.environ[ENV_CHAIN] = inherited
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
