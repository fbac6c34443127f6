"""Launch a stage's worker processes with torchrun and read back their result.

SIGTERM to this process (or to the whole process group) reaches every worker, which
saves at its current micro-step and exits 0: the stage then reports `preempted`.
SIGKILL of this process takes torchrun and every worker with it (stages.lifeline), and
the stage directory is locked for the whole launch (stages.run_lock).
"""
from __future__ import annotations

import json
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from core.config.compose import as_dict, config_hash
from core.config.schema import BatonConfig
from ckpt.layout import checkpoints_dir, stage_dir
from stages.data.prepare import prepare_data
from stages.data.resume import check_same_data
from stages.errors import StageFailed
from stages.preflight import check_stage_inputs
from stages.lifeline import torchrun_command, write_launch_file
from stages.nodes import node_file, node_suffix, rendezvous_args
from stages.run_files import RESULT
from stages.run_lock import stage_lock
from stages.worker_env import worker_env
from stages.worker_output import (WorkerOutput, killed_by_signal, python_error,
                                  rank_zero_killed)

ERROR_FILE = "worker_error.json"
PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
             "RendezvousConnectionError")
"""What a rank or its torchrun agent records when another node's processes die: gloo's
closed or reset connection (tcp/pair.cc), or the lost c10d store when that node hosted
the rendezvous."""


@dataclass
class StageResult:
    status: str
    step: int
    checkpoints: list[dict]
    checkpoints_dir: Path
    raw: dict
    data: dict | None = None
    """The data plan the stage trained on (stages.data.prepare); None: the built-in tasks."""


def launch_stage(cfg: BatonConfig, model_dir: Path, parent: dict | None = None, *,
                 inputs_checked: bool = False) -> StageResult:
    """`inputs_checked`: the caller already ran `stages.preflight.check_stage_inputs`.
    The stage directory's lock (stages.run_lock) is held from before launch.json is
    written until the workers are gone: a second launch there is refused at once."""
    with stage_lock(stage_dir(cfg.run.dir, cfg.stage.name), node=cfg.parallel.node_rank):
        if not inputs_checked:
            check_stage_inputs(cfg)  # model.path and starting checkpoints, before any worker
        data = prepare_data(cfg, model_dir)  # your data, checked and tokenized (cached)
        check_same_data(cfg, data)  # a resume reads what its checkpoint was trained on
        if cfg.stage.name == "rl" and cfg.rl.replay_journal is None:
            # RL roles (rollout, reward) run as Ray actors beside the trainer workers.
            from stages.rl.launcher import run_with_roles
            return run_with_roles(cfg, model_dir,
                                  lambda c, env: _launch_locked(c, model_dir, parent, env, data),
                                  lambda line: _note(cfg, line), data)
        return _launch_locked(cfg, model_dir, parent, {}, data)


def _note(cfg: BatonConfig, line: str) -> None:
    from stages.run_files import RunFiles
    RunFiles(stage_dir(cfg.run.dir, cfg.stage.name), True).log(line)


def _launch_locked(cfg: BatonConfig, model_dir: Path, parent: dict | None,
                   extra_env: dict, data: dict | None = None) -> StageResult:
    directory = stage_dir(cfg.run.dir, cfg.stage.name)
    directory.mkdir(parents=True, exist_ok=True)
    launch_file = node_file(directory, "launch.json", cfg.parallel)
    binding = write_launch_file(launch_file, {
        "config": as_dict(cfg), "config_hash": config_hash(cfg), "model_dir": str(model_dir),
        "parent": parent, "data_plan": data})
    if cfg.parallel.node_rank == 0:  # the node whose launcher reads a result first clears it
        (directory / RESULT).unlink(missing_ok=True)
    error_file = node_file(directory, ERROR_FILE, cfg.parallel)
    error_file.unlink(missing_ok=True)
    # torchrun under stages.lifeline: the agent and the workers die with this process.
    command = torchrun_command(cfg.parallel.world_size, "stages.worker", launch_file,
                               rendezvous_args(cfg.parallel, cfg.run.dir, cfg.stage.name))
    # torchrun's @record writes a worker's Python exception here; its absence after a
    # failure means the workers were killed or never met (infrastructure).
    process = subprocess.Popen(command, env={**worker_env(cfg.repro), **extra_env, **binding,
                                             "TORCHELASTIC_ERROR_FILE": str(error_file)},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    output = WorkerOutput(directory, node_suffix(cfg.parallel))
    output.start(process)
    previous = signal.signal(signal.SIGTERM, lambda *_: process.send_signal(signal.SIGTERM))
    try:
        returncode = process.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
        output.finish()
    result_path = directory / RESULT
    # Another node's launcher may have left last run's result: trust it only after a clean exit.
    if not result_path.is_file() or (cfg.parallel.node_rank and returncode != 0):
        raise _failure(cfg.stage.name, returncode, output, error_file)
    raw = json.loads(result_path.read_text())
    return StageResult(raw["status"], raw["progress"]["step"], raw["checkpoints"],
                       checkpoints_dir(cfg.run.dir, cfg.stage.name), raw, data)


def _failure(stage: str, returncode: int, output: WorkerOutput, error_file: Path) -> StageFailed:
    """The clearest account of why the workers wrote no result: a worker's own message, else
    the unexpected exception torchrun recorded, else an infrastructure failure."""
    if output.errors:
        first = output.errors[0]
        rank = f"rank {first['rank']}: " if first.get("rank") not in (None, 0) else ""
        return StageFailed(stage, returncode, output.where(), cause=rank + first["message"])
    if error_file.exists():
        unexpected = python_error(error_file) or f"error (recorded in {error_file})"
        if any(sign in unexpected for sign in PEER_LOST):
            # A rank on another node died: this node's workers only saw its socket close.
            return StageFailed(stage, returncode, output.where(), infrastructure=True, reason=(
                "a rank on another node stopped answering (its node or processes were lost)"))
        return StageFailed(stage, returncode, output.where() + ", with the traceback", cause=(
            f"a worker raised an unexpected {unexpected}; this is a bug in baton or a library "
            "it uses, not in your input"))
    killed = killed_by_signal(output.tail) or rank_zero_killed(returncode)
    reason = f"{killed}: killed from outside, out of memory, or crashed" if killed else None
    return StageFailed(stage, returncode, output.where(), infrastructure=True, reason=reason)

