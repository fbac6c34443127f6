"""`python -m experiments.save_profile`: the parts of a save are measured on the training thread
and nest as the calls do, the saver thread's CPU is reported in async mode, and a bad flag
is refused in one line."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

PART = re.compile(r"^per save, training thread: (.+): ([0-9.]+) ms$", re.M)
UNPROFILED_PART = re.compile(
    r"^per save, training thread, no profiler \(median of (\d+)\): (.+): ([0-9.]+) ms$", re.M)


def profile(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "experiments.save_profile", *args], cwd=REPO,
                          text=True, capture_output=True, timeout=300)


@pytest.mark.slow
def test_the_parts_of_a_save_nest_as_the_calls_do():
    proc = profile("--steps", "2", "--rounds", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    parts = {label: float(ms) for label, ms in PART.findall(proc.stdout)}
    call, capture = parts["the save call (Checkpointer.save)"], parts["baton's capture (Checkpointer._capture)"]
    deepspeed = parts["DeepSpeed's save_checkpoint"]
    snapshot = parts["baton's snapshot into staging (ckpt.snapshot)"]
    # Each part is called inside the one before it, so none can take longer than it.
    assert call >= capture >= deepspeed >= snapshot > 0, parts
    saver = re.search(r"saver thread CPU per save \(median, its main thread\): ([0-9.]+) ms",
                      proc.stdout)
    assert saver and float(saver.group(1)) > 0, proc.stdout
    steps = re.search(r"step: ([0-9.]+) ms without saves, ([0-9.]+) ms with a save", proc.stdout)
    assert steps and all(float(v) > 0 for v in steps.groups()), proc.stdout
    # Timed again by wrapping the calls, no profiler: every save of the interleaved blocks.
    found = UNPROFILED_PART.findall(proc.stdout)
    assert {int(saves) for saves, _, _ in found} == {2 * 3}, proc.stdout  # --steps 2, 3 rounds
    assert "no profiler, 3 interleaved rounds, medians" in proc.stdout
    parts = {label: float(ms) for _, label, ms in found}
    call, capture = parts["the save call (Checkpointer.save)"], parts["baton's capture (Checkpointer._capture)"]
    deepspeed = parts["DeepSpeed's save_checkpoint"]
    inside = [parts["in it, baton's staging of the state (BatonCheckpointEngine.save)"],
              parts["in it, the module's state dict (module_state_dict)"],
              parts["in it, the common state, the optimizer's included (_common_checkpoint_state)"]]
    json_payloads = parts["baton's JSON payloads (BatonCheckpointEngine.save_json)"]
    assert call >= capture >= deepspeed >= max(inside) and min(inside) > 0, parts
    assert capture >= json_payloads > 0, parts
    split = re.search(r"the step's own work ([0-9.]+) ms wall, ([0-9.]+) ms CPU without saves; "
                      r"([0-9.]+) ms wall, ([0-9.]+) ms CPU with saves in flight; building the "
                      r"save's payload ([0-9.]+) ms", proc.stdout)
    assert split and all(float(v) > 0 for v in split.groups()), proc.stdout


@pytest.mark.slow
def test_the_cpu_of_every_thread_and_of_the_saver_process_is_read():
    proc = profile("--steps", "8", "--saver", "process")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(re.findall(r"^CPU per step (without saves|with a save after each), no "
                            r"profiler: (.+)$", proc.stdout, re.M))
    assert set(lines) == {"without saves", "with a save after each"}, proc.stdout
    without, with_saves = (_cpu_line(lines[k]) for k in ("without saves", "with a save after each"))
    # The training thread works in both blocks, the saver process only in the one with
    # saves (it idles, started, through the block without). /proc counts in ticks of
    # 10 ms, so threads that used less in a block may be missing from its line.
    assert without["MainThread"] > 0 and with_saves["MainThread"] > 0
    assert without["saver"] == 0 < with_saves["saver"]
    assert 0 <= with_saves["kernel"] <= with_saves["saver"]


def _cpu_line(line: str) -> dict:
    threads, saver = line.split("; child processes (the saver process) ")
    found = {name: float(ms) for name, ms in re.findall(r"([\w-]+) ([0-9.]+) ms", threads)}
    total, kernel = re.match(r"([0-9.]+) ms, of which in the kernel ([0-9.]+) ms", saver).groups()
    return {**found, "saver": float(total), "kernel": float(kernel)}


@pytest.mark.parametrize("flag", ["--steps", "--rounds"])
def test_a_bad_flag_is_refused_without_a_traceback(flag):
    proc = profile(flag, "0")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and f"{flag} must be at least 1 (got 0)" in proc.stderr
