"""Run one program of the policy's in a fresh sandboxed process and classify how it ended.

Each run gets a new process (stages.sandbox_boot: own network namespace where allowed,
rlimits, an audit hook) and a new scratch directory, removed afterwards. The outcome is
one of three kinds, and only the first two may ever become a reward:

- `success`: the program ran and printed the expected answer;
- `policy_failure`: it is the program's doing, so it earns its reward of 0: a wrong
  answer, an exception, an invalid program, something the sandbox denied, or running
  out of its CPU seconds or memory;
- `env_failure`: the sandbox failed, not the program: a crash (killed by a signal the
  limits do not send), a hang that used almost no CPU (`env_timeout`: the wall-clock
  limit ran out first), or an infrastructure error (no scratch directory, no process).

A wall-clock timeout is the program's fault when it used at least half its CPU
seconds by then, the environment's otherwise (hence rl.env.timeout_s >= 2 * cpu_s: a
computing program meets its CPU limit first even when it gets half a core). A program that blocks without computing
(e.g. `signal.pause()` is not audited) is therefore an environment failure: retried,
then its group dropped, never scored. That errs towards dropping, not towards
mis-scoring.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from stages import sandbox_boot

SUCCESS, POLICY_FAILURE, ENV_FAILURE = "success", "policy_failure", "env_failure"
OUTPUT_LIMIT = 64 * 1024
BOOT = Path(sandbox_boot.__file__).resolve()


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 5.0
    cpu_s: int = 2
    memory_mb: int = 256


@dataclass
class Outcome:
    kind: str
    """success, policy_failure or env_failure."""
    reason: str
    """Why, in a few words (e.g. `wrong answer`, `denied: socket.connect`, `env_crash`)."""
    output: str
    seconds: float
    exit: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def run_program(program: str, expected: str, limits: Limits, root: Path,
                fault: str | None = None) -> Outcome:
    """`fault`: an injected environment failure (crash, timeout or infra), or None."""
    started = time.perf_counter()
    try:
        if fault == "infra":
            raise OSError("injected infrastructure failure (rl.faults.env_infra_rate)")
        scratch = Path(tempfile.mkdtemp(prefix="attempt-", dir=root))
    except OSError as exc:
        return Outcome(ENV_FAILURE, f"env_infra: {exc}", "", time.perf_counter() - started)
    try:
        return _run_in(scratch, program, expected, limits, fault, started)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run_in(scratch: Path, program: str, expected: str, limits: Limits, fault, started) -> Outcome:
    spec = json.dumps({"program": program, "cpu_s": limits.cpu_s, "memory_mb": limits.memory_mb,
                       "scratch": str(scratch), "fault": fault})
    try:
        proc = subprocess.Popen([sys.executable, "-I", "-S", str(BOOT), spec], cwd=scratch,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env={"LC_ALL": "C.UTF-8"},
                                start_new_session=True)  # its own group: killed whole
    except OSError as exc:
        return Outcome(ENV_FAILURE, f"env_infra: {exc}", "", time.perf_counter() - started)
    cpu = 0.0
    try:
        out, err = proc.communicate(timeout=limits.timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        cpu = _cpu_seconds(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        timed_out = True
    seconds = time.perf_counter() - started
    output = out[:OUTPUT_LIMIT].decode("utf-8", "replace").strip()
    kind, reason = classify(proc.returncode, timed_out, cpu, limits, output, expected, err)
    return Outcome(kind, reason, output[:200], seconds, proc.returncode)


def classify(code: int, timed_out: bool, cpu: float, limits: Limits, output: str,
             expected: str, err: bytes) -> tuple[str, str]:
    if timed_out:
        if cpu >= limits.cpu_s / 2:
            return POLICY_FAILURE, f"ran past {limits.timeout_s} s, computing"
        return ENV_FAILURE, f"env_timeout: no result after {limits.timeout_s} s ({cpu:.2f} s of CPU)"
    if code == 0:
        return (SUCCESS, "correct") if output == expected else (POLICY_FAILURE, "wrong answer")
    if code in (sandbox_boot.EXIT_RAISED, sandbox_boot.EXIT_DENIED):
        status = _status(err)
        prefix = "denied" if code == sandbox_boot.EXIT_DENIED else f"raised {status.get('type', '?')}"
        return POLICY_FAILURE, f"{prefix}: {status.get('message', '')}"[:200]
    if code in (-signal.SIGXCPU, -signal.SIGKILL) and _cpu_limit_reached(err):
        return POLICY_FAILURE, f"used its {limits.cpu_s} s of CPU"
    if code < 0:
        return ENV_FAILURE, f"env_crash: the sandbox died of signal {signal.Signals(-code).name}"
    return ENV_FAILURE, f"env_crash: the sandbox exited {code} without a status"


def _status(err: bytes) -> dict:
    for line in reversed(err.decode("utf-8", "replace").splitlines()):
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict) and "status" in found:
            return found
    return {}


def _cpu_limit_reached(err: bytes) -> bool:
    """SIGXCPU comes from RLIMIT_CPU only; SIGKILL too when the hard limit follows it. The
    boot line on stderr says the limits were set (an injected crash dies before)."""
    return b"network_namespace" in err


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a live process, from /proc (utime, stime: fields 14, 15)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0
