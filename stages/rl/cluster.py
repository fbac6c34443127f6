"""The Ray instance the RL roles run on: an existing cluster (`rl.ray.address`) or a local
one started with the stage, bound to 127.0.0.1 alone, and stopped with it.

Ray resolves "127.0.0.1" to the machine's routable address on Linux unless its cluster
mode is off (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, the single-machine mode it uses on
macOS); only then do the GCS, raylet, object manager and workers listen on loopback. The
variable is set for this process and inherited by everything Ray starts from it. The
trainer workers join the instance as drivers of their own (address + namespace in the
environment), so a trainer restart never touches the rollout and reward actors.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from core.errors import BatonError

ENV_ADDRESS, ENV_NAMESPACE = "BATON_RAY_ADDRESS", "BATON_RAY_NAMESPACE"
# Told to a (re)launched trainer: which attempt it is, and when the previous one died.
ENV_ATTEMPT, ENV_DIED_AT = "BATON_TRAINER_ATTEMPT", "BATON_TRAINER_DIED_AT"
LOOPBACK = "127.0.0.1"
SINGLE_MACHINE = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
PROBE_TIMEOUT_S = 5
QUIET = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0"}
# Ray starts a default worker per CPU for the first driver, ahead of tasks this instance
# never runs: the roles are actors, mostly with a runtime environment of their own (kernel
# pins, stages.rl.warm_worker) that a default worker cannot take. Each imports Ray,
# about a second of CPU, for nothing.
NO_PRESTART = {"prestart_worker_first_driver": False, "enable_worker_prestart": False}


class RayUnreachable(BatonError):
    def __init__(self, address: str, cause: BaseException):
        self.address = address
        super().__init__(
            f"rl.ray.address={address!r}: could not connect to a Ray cluster there "
            f"({type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else 'no detail'}). "
            "Nothing was trained. Start the cluster first (`ray start --head "
            "--node-ip-address=127.0.0.1`), fix the address, or set rl.ray.address=null to "
            "let the stage start a local instance of its own")


@dataclass
class RayHandle:
    address: str
    namespace: str
    started_here: bool

    def env(self) -> dict[str, str]:
        """What a trainer worker needs to join: the GCS address and the roles' namespace."""
        extra = SINGLE_MACHINE if self.started_here else {}
        return {ENV_ADDRESS: self.address, ENV_NAMESPACE: self.namespace, **extra, **QUIET}


def start(address: str | None, namespace: str, dashboard: bool = False) -> RayHandle:
    """Connect to `address`, or start a loopback-only local instance (no dashboard unless
    asked for). The caller owns it: `stop()` when the stage ends."""
    os.environ.update(QUIET)
    if address is None:
        os.environ.update(SINGLE_MACHINE)
    import ray
    from ray._private import ray_constants

    if address is None:
        ray_constants.ENABLE_RAY_CLUSTER = False  # read at call time; env covers children
        context = ray.init(_node_ip_address=LOOPBACK, include_dashboard=dashboard,
                           dashboard_host=LOOPBACK, namespace=namespace, log_to_driver=False,
                           configure_logging=False, _system_config=NO_PRESTART)
        return RayHandle(context.address_info["gcs_address"], namespace, True)
    _probe(address)
    try:
        ray.init(address=address, namespace=namespace, log_to_driver=False,
                 configure_logging=False)
    except Exception as exc:  # ConnectionError, ValueError, RaySystemError: all mean the same
        raise RayUnreachable(address, exc) from None
    return RayHandle(address, namespace, False)


def _probe(address: str) -> None:
    """A TCP connect to the GCS first: ray.init retries an unreachable address for
    minutes before it gives up, and the user should hear in seconds."""
    import socket

    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S):
            pass
    except OSError as exc:
        raise RayUnreachable(address, exc) from None


def join_from_env():
    """In a trainer worker: join the instance the launcher started or connected to; the
    namespace holds the roles' named actors. None when the launcher started no roles."""
    address = os.environ.get(ENV_ADDRESS)
    if not address:
        return None
    import ray

    if not ray.is_initialized():
        ray.init(address=address, namespace=os.environ[ENV_NAMESPACE], log_to_driver=False,
                 configure_logging=False)
    return ray


def stop() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
