"""`python -m stages.launch_agent TORCHRUN-ARGS`: the process between a launcher and its
workers (stages.lifeline says how it and they die with the launcher).

Only a launch across nodes needs torchrun's agent (rendezvous with the other nodes'
agents). On one node (`--standalone`) there is no one to meet and nothing to restart: a
warm process of the fork server forks the workers when there is one
(stages.warm_launch); otherwise one process gets torchrun's environment and this agent
becomes it (exec), and several are forked by `stages.fork_agent` from one import of
their libraries.
"""
from __future__ import annotations

import os
import sys

from stages.lifeline import hold, join_chain, single_worker_environment


def main(argv: list[str] | None = None) -> None:
    from core import loopback

    argv = sys.argv[1:] if argv is None else argv
    address = listen_address(argv)
    if address is not None:  # the workers inherit where to listen
        os.environ.update(loopback.listen_environment(address))
    if "--standalone" in argv:  # a warm process forks the workers (stages.fork_server)
        from stages import warm_launch
        warm_launch.run(argv, _nproc(argv))  # returns when the launch must start cold
    if "--standalone" in argv and "--nproc-per-node=1" in argv:
        become_the_only_worker(argv)  # does not return
    if "--standalone" in argv:  # one node, no restarts: fork the ranks from one import
        from stages import fork_agent
        watch = join_chain()
        fork_agent.run(_nproc(argv), argv[argv.index("-m") + 1:], watch or (lambda: None))
    # Several nodes: torchrun's agent, which meets the other nodes' agents.
    if address is not None:
        loopback.serve_stores_on(address)
        argv = [f"--local-addr={address}", *argv]  # the workers' MASTER_ADDR, not the FQDN
    hold()
    from torch.distributed.run import main as torchrun

    torchrun(argv)


def _nproc(argv: list[str]) -> int:
    return int(next(arg.split("=", 1)[1] for arg in argv if arg.startswith("--nproc-per-node=")))


def listen_address(argv: list[str]) -> str | None:
    """Where every store and gloo socket of the launch listens: 127.0.0.1 on one node;
    across nodes, this node's address on the route to the rendezvous endpoint (on the node
    that hosts it, the endpoint's own address). None: torch's defaults (no IPv4 route)."""
    from core import loopback

    if "--standalone" in argv:
        return loopback.LOOPBACK
    endpoint = next((arg.split("=", 1)[1] for arg in argv if arg.startswith("--rdzv-endpoint=")),
                    None)
    return loopback.address_toward(endpoint.rsplit(":", 1)[0]) if endpoint else None


def become_the_only_worker(argv: list[str]) -> None:
    """Exec the one worker of a one-process launch with the variables torchrun would give
    it. This process's pid, parent and lifeline chain stay the worker's, so the worker's
    own `hold()` ties it to the launcher, and the launcher sees its exit status directly."""
    command = argv[argv.index("-m") + 1:]
    os.environ.update(single_worker_environment())
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-u", "-m", *command])


if __name__ == "__main__":
    main()
