"""One `baton bench ckpt --selective`: what selective persistence (ckpt.selective) saves in
bytes, and what a restart from one of its composite checkpoints costs in loss
(docs/bench.md, "Selective persistence").

Four real `baton stage sft` runs, one after the other, with the same config and steps:
1. full saves (ckpt.selective.threshold=null), 2. selective saves (the threshold and
full_every given); 3. a restart from the selective run's last composite checkpoint at or
before the middle, and 4. a restart from the full run's checkpoint of the same step (the
control: a whole checkpoint resumes bit-exact). Each restart runs to the same max_steps
(the learning-rate schedule depends on it); the --restart-steps steps after it are
compared with the uninterrupted run of its own kind.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from core.config.compose import quoted

from bench.console import gb, progress
from bench.machine import machine_info
from bench.selective_options import TOLERANCE, SelectiveBenchOptions
from bench.selective_stage import (StageRun, common_overrides, run_stage,
                                   selective_overrides)
from bench.selective_summary import bytes_summary, deviation, restart_point

RUNS = 4


def run_selective_bench(options: SelectiveBenchOptions) -> dict:
    options.check()
    workdir = Path(tempfile.mkdtemp(prefix="baton-bench-selective-", dir=options.workdir)).resolve()
    try:
        shared, chosen = common_overrides(options), selective_overrides(options)
        full = _run(1, "full saves", workdir / "full", shared)
        selective = _run(2, f"selective saves ({' '.join(chosen)})", workdir / "selective",
                         shared + chosen)
        full_saves, selective_saves = full.saves(), selective.saves()
        point = restart_point(selective_saves, options.middle)
        progress(f"restart point: {point['checkpoint']} "
                 f"({len(point['references'])} layer files referenced)")
        restarted = _run(3, f"restart from selective {point['checkpoint']}",
                         workdir / "selective-restart",
                         shared + chosen + [quoted("resume", selective.checkpoints / point["checkpoint"])])
        control = _run(4, f"restart from full {point['checkpoint']} (control)",
                       workdir / "full-restart",
                       shared + [quoted("resume", full.checkpoints / point["checkpoint"])])
        runs = {"full": full, "selective": selective, "restarted": restarted, "control": control}
        result = _result(options, runs, full_saves, selective_saves, point)
        result["machine"] = machine_info(workdir)
        return result
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _run(index: int, what: str, run_dir: Path, overrides: list[str]) -> StageRun:
    progress(f"stage {index}/{RUNS}: {what} ...")
    run = run_stage(run_dir, overrides)
    saves = run.saves()
    written = sum(save["bytes"] for save in saves)
    progress(f"stage {index}/{RUNS}: done in {run.seconds:.1f} s, {len(saves)} checkpoints "
             f"in the run directory, {gb(written)} written by their saves")
    return run


def _result(options: SelectiveBenchOptions, runs: dict[str, StageRun], full_saves: list[dict],
            selective_saves: list[dict], point: dict) -> dict:
    losses = {name: run.losses() for name, run in runs.items()}
    window = list(range(point["step"] + 1, point["step"] + options.restart_steps + 1))
    to_end = list(range(point["step"] + 1, options.steps + 1))

    def after_restart(reference: str, restarted: str) -> dict:
        compared = deviation(losses[reference], losses[restarted], window)
        compared["deviation_max_to_end"] = deviation(
            losses[reference], losses[restarted], to_end)["deviation_max"]
        return {**compared, "stage_s": runs[restarted].seconds}

    full, selective = bytes_summary(full_saves), bytes_summary(selective_saves)
    restart = {**point, **after_restart("selective", "restarted"), "tolerance": TOLERANCE}
    restart["within_tolerance"] = restart["deviation_max"] <= TOLERANCE
    control = {"step": point["step"], "checkpoint": point["checkpoint"],
               **after_restart("full", "control")}
    # Saving selectively must not change training itself: the two uninterrupted runs agree.
    every_step = sorted(losses["full"])
    return {
        "settings": {"stage": "sft", "parallel": "single", "steps": options.steps,
                     "save_every": options.save_every, "keep_last": options.keep_last,
                     "threshold": options.threshold, "full_every": options.full_every,
                     "restart_steps": options.restart_steps, "overrides": list(options.overrides)},
        "full": {**full, "stage_s": runs["full"].seconds},
        "selective": {**selective, "stage_s": runs["selective"].seconds},
        "bytes_ratio": full["total_bytes"] / selective["total_bytes"],
        "uninterrupted_deviation_max": deviation(
            losses["full"], losses["selective"], every_step)["deviation_max"],
        "restart": restart, "control": control,
        "control_deviation_max": control["deviation_max"],
    }
