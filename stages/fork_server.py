"""The fork server: stage workers that start without importing their libraries again.

Every launch of a stage or reshard worker is a fresh interpreter that imports torch,
DeepSpeed and a model family's transformers modules (3–4 s of CPU on the machines this
project runs on) before it computes; a pipeline, and the test suite far more, starts
hundreds. The fork server keeps warm processes (stages.zygote) that have done those
imports once and fork a worker for each launch (stages.warm_launch).

One warm process serves one *fingerprint*: the launch's environment without VOLATILE,
its interpreter, working directory and resource limits. Everything a library reads when
it is imported is in the fingerprint, so a launch with other settings (portable mode's
kernel pins, another thread count) gets a warm process of its own, started with exactly
its environment. At most MAX_WARM live at once; the least recently used is stopped.

Owner API: `start()` returns a `ForkServer`; put its `environment` into the environment
of whatever launches stages (the test session, `baton run`) and call `stop()` when done,
which ends the server and its warm processes by pid. The server ties itself to its
owner and each warm process to the server (stages.lifeline): SIGKILL of the owner takes
them all. Without the variable, or when the server cannot help, a launch starts cold as
before.
"""
from __future__ import annotations

import hashlib
import json
import os
import resource
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from core import processes
from stages import fork_wire
from stages.lifeline import ENV_CHAIN, ENV_NONCE, hold

ENV = "BATON_FORK_SERVER"
CONTROL = "control.sock"
WARM_LOG = "warm.jsonl"
FORKS_LOG = "forks.jsonl"  # written by the warm processes (stages.zygote)
# A pipeline's workers and RL actors share one fingerprint; re-runs on another ISA
# (repro.isa), launches from flow processes and tests' own variables add more (a fresh-clone
# test run starts 18 warm processes over its two test processes).
MAX_WARM = 4
START_SECONDS = 180.0
STOP_SECONDS = 10.0
# Read only at run time, and different for every launch: left out of the fingerprint.
VOLATILE = frozenset({
    ENV, ENV_CHAIN, ENV_NONCE, "TORCHELASTIC_ERROR_FILE", "PYTEST_CURRENT_TEST",
    # stages.rl.cluster: where and as which attempt an RL trainer joins its roles.
    "BATON_RAY_ADDRESS", "BATON_RAY_NAMESPACE", "BATON_TRAINER_ATTEMPT", "BATON_TRAINER_DIED_AT",
    "PYTHONBREAKPOINT",  # read by sys.breakpointhook at each call
    "SPT_NOENV",  # Ray's, for setproctitle, which its workers import after the fork
    # torch.distributed's rendezvous, read when a process group starts (after the fork; a
    # launch from a process that joined one, such as a flow's handoff, has them set).
    "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
    "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_NAME",
    "ROLE_RANK", "ROLE_WORLD_SIZE",
})
# Ray's variables, which an RL launcher's process sets once it has started Ray, and
# Prefect's, which a flow's process sets: the warm image imports neither (stages.warm_image
# checks), so a worker reads them only when it imports one itself, from its own environment.
# torchrun's TORCHELASTIC_ ones are read by its agent and at a process group's start.
VOLATILE_PREFIXES = ("RAY_", "PREFECT_", "TORCHELASTIC_")


def _inductor_cache_dir() -> str:
    """The directory torch's inductor sets TORCHINDUCTOR_CACHE_DIR to, with setdefault,
    the first time it looks for its cache (torch._inductor.runtime.cache_dir_utils): an RL
    launcher's process has; a process that never looked has not, and means the same."""
    import getpass
    import re

    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


# What a launch's environment means where it lacks a variable that libraries set with
# setdefault when they load or first look (`import deepspeed` sets the first): a launch from
# a process that did that has them, one from a process that did not means the same values.
# scikit-learn's import sets KMP_DUPLICATE_LIB_OK (launches from flow processes have it, one
# extra warm process each): Intel's OpenMP runtime reads it only when a second copy of itself
# loads, which ends the process without it, so a worker that runs at all computes the same.
IMPORT_DEFAULTS = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1",
                   "TORCHINDUCTOR_CACHE_DIR": _inductor_cache_dir(),
                   "KMP_DUPLICATE_LIB_OK": "True"}
LIMITS = ("RLIMIT_AS", "RLIMIT_CORE", "RLIMIT_DATA", "RLIMIT_FSIZE", "RLIMIT_NOFILE",
          "RLIMIT_NPROC", "RLIMIT_STACK")


def fingerprint(env: Mapping[str, str], cwd: str) -> dict:
    """What a warm process must share with a launch it takes."""
    env = {**IMPORT_DEFAULTS, **env}
    kept = {k: v for k, v in sorted(env.items())
            if k not in VOLATILE and not k.startswith(VOLATILE_PREFIXES)}
    return {"environment": kept,
            "executable": sys.executable, "cwd": cwd, "limits": _limits()}


def _limits() -> dict[str, list[int]]:
    return {name: list(resource.getrlimit(getattr(resource, name)))
            for name in LIMITS if hasattr(resource, name)}


def _key(print_: dict) -> str:
    return hashlib.sha256(json.dumps(print_, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class ForkServer:
    process: subprocess.Popen
    directory: Path

    @property
    def environment(self) -> dict[str, str]:
        return {ENV: str(self.directory / CONTROL)}

    def forks(self) -> list[dict]:
        """One record per worker process a warm process forked (stages.zygote)."""
        return _records(self.directory / FORKS_LOG)

    def warm_starts(self) -> list[dict]:
        """One record per warm process started (see `_record_start`)."""
        return _records(self.directory / WARM_LOG)

    def stop(self) -> None:
        _stop(self.process)
        shutil.rmtree(self.directory, ignore_errors=True)


def _records(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []


def start() -> ForkServer:
    """A fork server owned by this process (it exits with it)."""
    directory = Path(tempfile.mkdtemp(prefix="baton-fork-server-"))
    chain = ",".join(filter(None, (os.environ.get(ENV_CHAIN), processes.current().token())))
    env = {**{k: v for k, v in os.environ.items() if k != ENV}, ENV_CHAIN: chain}
    process = subprocess.Popen([sys.executable, "-m", "stages.fork_server", str(directory)],
                               env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
    if process.stdout.readline().strip() != "ready":
        _stop(process)
        shutil.rmtree(directory, ignore_errors=True)
        raise RuntimeError("baton's fork server did not start (see the output above)")
    return ForkServer(process, directory)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# -- the server process ------------------------------------------------------------------

@dataclass
class Warm:
    process: subprocess.Popen
    socket: Path


def serve(directory: Path) -> None:
    hold()  # dies with its owner
    warm: OrderedDict[str, Warm] = OrderedDict()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    control.bind(str(directory / CONTROL))
    control.listen(64)
    print("ready", flush=True)
    try:
        while True:
            connection, _ = control.accept()
            with connection:
                try:
                    request, _ = fork_wire.receive(connection)
                    if request is not None:
                        fork_wire.send(connection, _warm_for(request["fingerprint"], warm, directory))
                except (OSError, ValueError, KeyError):
                    continue  # that launch starts cold
    finally:
        for process in warm.values():
            _stop(process.process)


def _warm_for(print_: dict, warm: OrderedDict, directory: Path) -> dict:
    """{"socket": path} of the warm process for this fingerprint, or {"refused": why}."""
    if print_["limits"] != _limits() or print_["executable"] != sys.executable:
        return {"refused": "the launch's interpreter or resource limits are not the server's"}
    key = _key(print_)
    current = warm.pop(key, None)
    if current is None or current.process.poll() is not None:
        while len(warm) >= MAX_WARM:
            _stop(warm.popitem(last=False)[1].process)
        current = _start_warm(print_, directory / f"warm-{key}.sock", directory / f"warm-{key}.log")
        _record_start(directory, key, print_, current)
        if isinstance(current, str):
            return {"refused": current}
    warm[key] = current
    return {"socket": str(current.socket)}


def _record_start(directory: Path, key: str, print_: dict, started: Warm | str) -> None:
    """warm.jsonl: one line per warm process started, with the variables in which its
    fingerprint differs from the one started before it (why a launch did not find one)."""
    log = directory / WARM_LOG
    lines = log.read_text().splitlines() if log.is_file() else []
    before = json.loads(lines[-1])["environment"] if lines else {}
    now = print_["environment"]
    differs = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
    record = {"key": key, "started": not isinstance(started, str), "differs": differs if lines else [],
              "environment": now}
    with open(log, "a") as handle:
        handle.write(json.dumps(record) + "\n")


def _start_warm(print_: dict, path: Path, log: Path) -> Warm | str:
    path.unlink(missing_ok=True)
    env = {**print_["environment"], ENV_CHAIN: os.environ[ENV_CHAIN]}
    with open(log, "a") as errors:
        process = subprocess.Popen([sys.executable, "-u", "-m", "stages.zygote", str(path)],
                                   env=env, cwd=print_["cwd"], stdout=subprocess.PIPE,
                                   stderr=errors, text=True, start_new_session=True)
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        ready = selector.select(START_SECONDS) and process.stdout.readline().strip() == "ready"
    if ready:
        return Warm(process, path)
    _stop(process)
    tail = log.read_text()[-2000:] if log.is_file() else ""
    return f"the warm process did not start: {tail.strip() or 'no output'}"


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
