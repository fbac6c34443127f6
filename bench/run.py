"""One `baton bench ckpt`: every size, every method, the loads, checkpoint-every-step; the
result is the JSON the issue specifies (docs/bench.md)."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from bench.console import progress, quiet_libraries
from bench.harness import close_all, run_interleaved
from bench.load import compare_loads
from bench.machine import machine_info
from bench.methods.baton_checkpointer import BatonSave
from bench.methods.catalog import all_methods
from bench.options import BenchOptions
from bench.ratios import with_ratios
from bench.training import TrainingStep
from bench.writers import writer_gain

# Checkpoint-every-step blocks: (steps per block, blocks). The large model's steps take
# seconds, the tiny model's milliseconds. The tiny model's blocks move by ±15% from one
# round to the next on this 2-core VM, so its ratio takes twelve rounds (about a minute).
LARGE_BLOCKS = (2, 2)
TINY_BLOCKS = {False: (20, 12), True: (8, 3)}
# A load of the same 1 GB took 0.24 to 2.2 s within one run here (how fast this VM hands
# out fresh memory depends on what ran before), so loads take at least seven rounds; each
# is a second or two.
LOAD_ROUNDS_AT_LEAST = 7


def run_bench(options: BenchOptions) -> dict:
    options.check()
    quiet_libraries()
    workdir = Path(tempfile.mkdtemp(prefix="baton-bench-", dir=options.workdir))
    try:
        points = []
        for size in sorted(options.sizes_gb):
            points.append(measure_size(size, options, workdir, size == options.main_size_gb))
        main = points[-1]
        every_step = {**by_saver("default_model", every_step_default_model(options, workdir)),
                      **by_saver("large_model", main.pop("every_step"))}
        progress("writers: native vs Python on the same bytes")
        writers = writer_gain(main["state_bytes"], max(options.rounds, 3), str(workdir))
        return {
            "bounds": main["bounds"], "methods": main["methods"],
            "unavailable": main["unavailable"], "load": main["load"], "every_step": every_step,
            "writers": writers,
            "sweep": {"sizes_gb": sorted(options.sizes_gb), "points": points},
            "machine": machine_info(workdir),
            "settings": {"sizes_gb": sorted(options.sizes_gb), "main_size_gb": options.main_size_gb,
                         "rounds": options.rounds, "quick": options.quick,
                         "every_step_blocks": options.every_step_blocks,
                         "overrides": list(options.overrides)},
        }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def sized_state(size_gb: float, options: BenchOptions, workdir: Path):
    from stages.tokenizer import build_char_tokenizer

    from bench.state import build_state, shape_for

    shape = shape_for(size_gb, len(build_char_tokenizer()))
    progress(f"{size_gb:g} GB: building the model {shape} and one optimizer step")
    state = build_state(f"{size_gb:g} GB", options.overrides, workdir / f"model-{size_gb:g}gb",
                        shape)
    return state, shape


def measure_size(size_gb: float, options: BenchOptions, workdir: Path, is_main: bool) -> dict:
    state, shape = sized_state(size_gb, options, workdir)
    label = f"{size_gb:g} GB"
    try:
        state_bytes = state.nbytes()
        methods = all_methods()
        try:
            outcome = run_interleaved(methods, state, workdir / f"saves-{size_gb:g}gb",
                                      options.rounds, label, TrainingStep(state))
            load = baton_load(methods, outcome, options.rounds, label)
        finally:
            close_all(methods)
        summaries = [m.summary() for m in outcome.measured]
        bounds, rows = with_ratios(summaries, state_bytes)
        point = {"size_gb": size_gb, "state_bytes": state_bytes, "params": state.params(),
                 "model": shape, "bounds": bounds, "methods": rows,
                 "unavailable": outcome.unavailable, "load": load}
        if is_main:
            point["every_step"] = every_step_large(state, options, workdir)
        return point
    finally:
        state.close()


def baton_load(methods, outcome, rounds: int, label: str) -> dict | None:
    """Loads of the newest checkpoint of the first baton method that ran."""
    ran = {m.name for m in outcome.measured}
    for method in methods:
        if isinstance(method, BatonSave) and method.name in ran and method.last is not None:
            result = compare_loads(method.last, max(rounds, LOAD_ROUNDS_AT_LEAST), label)
            return {"written_by": method.name, **result}
    return None


def by_saver(model: str, runs: dict) -> dict:
    """The every_step entries of one model: `model` for the thread saver (the default),
    `model`_saver_process for the saver process, measured in the same blocks."""
    if "skipped" in runs:
        return {model: runs}
    return {(model if saver == "thread" else f"{model}_saver_{saver}"): run
            for saver, run in runs.items()}


def every_step_large(state, options: BenchOptions, workdir: Path) -> dict:
    from bench.every_step import run_every_step

    if options.quick:
        return {"skipped": "--quick"}
    steps, blocks = LARGE_BLOCKS
    return run_every_step(state, workdir / "every-step-large", state.cfg.ckpt.mode, steps, blocks,
                          f"{options.main_size_gb:g} GB")


def every_step_default_model(options: BenchOptions, workdir: Path) -> dict:
    """The configured model (conf/model/tiny.yaml unless overridden) with the stage's own
    batch shape and accumulation, as `baton stage cpt` trains it."""
    from bench.every_step import run_every_step
    from bench.state import build_state

    progress("default model: building it for the checkpoint-every-step run")
    state = build_state("default model", options.overrides, workdir / "model-default", None)
    try:
        steps, blocks = TINY_BLOCKS[options.quick]
        blocks = options.every_step_blocks or blocks
        return run_every_step(state, workdir / "every-step-default", state.cfg.ckpt.mode, steps,
                              blocks, "default model")
    finally:
        state.close()
