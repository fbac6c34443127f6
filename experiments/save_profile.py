"""Where an every-step save's time goes on the training thread, and what the saves in
flight do to the step around them.

    python -m experiments.save_profile [--steps 40] [--rounds 4] [--mode async|sync]
                                 [--saver thread|process] [overrides]

The default model trains `--steps` optimizer steps without saves, then `--steps` with a
baton save (`ckpt.mode`) after each, both under cProfile on the training thread (the
saver's own threads are not profiled). It prints:
- the step time of both blocks, the step's own work (forward, backward, optimizer) in
  the block with saves against the block without, which is what the saver thread's GIL
  holding costs it;
- per save, the training thread's milliseconds in each part of a save: the whole call,
  baton's capture, DeepSpeed's `save_checkpoint` and, inside it, baton's snapshot;
- the saver's CPU per save (Checkpointer.stats, async only): the saver thread's, or the
  saver process's main thread's with `ckpt.saver=process`;
- then, in two more blocks without the profiler, the CPU per step of every thread of the
  training process (the training thread, the lazy copier, the saver thread or the saver
  process's sender and listener, gloo's) and of the saver process (experiments.thread_cpu):
  everything a save costs besides the I/O;
- then, in interleaved blocks without the profiler (experiments.save_parts), the step's own work
  (wall and CPU of the training thread) without saves and with saves in flight, the
  payload's construction, and the save call's parts timed by wrapping the calls: the
  milliseconds to quote.

cProfile slows Python-heavy code, so read its parts as shares of a save, not as costs to
quote (the unprofiled parts are those); `baton bench ckpt`'s every-step line is the
throughput measurement. Why it exists:
docs/async_checkpoints.md ("What a save costs the step") says from it what an every-step
save still costs and what would remove it.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import shutil
import statistics
import tempfile
import time
from pathlib import Path

SAVE_PARTS = {
    "the save call (Checkpointer.save)": ("checkpointer.py", "save"),
    "baton's capture (Checkpointer._capture)": ("checkpointer.py", "_capture"),
    "DeepSpeed's save_checkpoint": ("engine.py", "save_checkpoint"),
    "baton's snapshot into staging (ckpt.snapshot)": ("snapshot.py", "snapshot"),
}
SPLIT_ROUNDS = 4
"""Default rounds of the unprofiled blocks (experiments.save_parts.step_split, `--rounds`): one
without saves and one with a save after each per round, `--steps` steps each. A few rounds
place the save call's parts; the step's own work with saves against without moves by more
than the saves cost it on a noisy VM unless the rounds are many."""
STEP_WORK = ("training.py", "train_steps")
"""bench.training.train_steps: forward, backward and optimizer step, without the save."""


def cumulative_s(stats: pstats.Stats, file_end: str, function: str) -> float:
    """Total cumulative seconds of every profiled function `function` in a file ending in
    `file_end` (DeepSpeed's engine.py and baton's ckpt/engine.py are told apart by name)."""
    return sum(entry[3] for (path, _, name), entry in stats.stats.items()
               if path.endswith(file_end) and name == function)


def profiled(work) -> pstats.Stats:
    profile = cProfile.Profile()
    profile.enable()
    try:
        work()
    finally:
        profile.disable()
    return pstats.Stats(profile)


def cpu_by_thread(trainer, steps: int) -> dict:
    """Unprofiled: CPU per step of each thread of this process and of the saver process,
    over a block without saves and one with a save after each (experiments.thread_cpu)."""
    from bench.console import stdout_to_stderr
    from experiments.thread_cpu import CpuReading

    before = CpuReading.now()
    trainer.train(steps)
    without = CpuReading.now().since(before, steps)
    before = CpuReading.now()
    with stdout_to_stderr():
        trainer.train_and_save(steps)
        trainer.checkpointer.drain()
    return {"without_saves": without, "with_saves": CpuReading.now().since(before, steps)}


def measure(steps: int, mode: str, overrides: list[str], saver: str = "thread",
            rounds: int = SPLIT_ROUNDS) -> dict:
    from bench.console import progress, stdout_to_stderr
    from bench.every_step import SavingTrainer
    from experiments.save_parts import step_split
    from bench.state import build_state

    workdir = Path(tempfile.mkdtemp(prefix="baton-save-profile-"))
    try:
        with stdout_to_stderr():
            state = build_state("default model", overrides, workdir / "model", None)
            trainer = SavingTrainer(state, workdir / "checkpoints", mode, saver)
            trainer.train_and_save(2)  # the first saves allocate the staging buffers
            trainer.checkpointer.drain()
        try:
            progress(f"save profile: {steps} steps without saves, then {steps} with a save after each")
            started = time.perf_counter()
            without = profiled(lambda: trainer.train(steps))
            without_s = time.perf_counter() - started

            def train_and_save() -> None:
                with stdout_to_stderr():
                    trainer.train_and_save(steps)
                    trainer.checkpointer.drain()

            started = time.perf_counter()
            with_saves = profiled(train_and_save)
            with_saves_s = time.perf_counter() - started
            background = [s["background_cpu_s"] for s in trainer.checkpointer.stats[2:]
                          if s["background_cpu_s"] is not None]
            cpu = cpu_by_thread(trainer, steps)
            with stdout_to_stderr():
                split = step_split(trainer, steps, rounds)
        finally:
            with stdout_to_stderr():
                trainer.checkpointer.close()
            state.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    parts = {label: cumulative_s(with_saves, *where) / steps for label, where in SAVE_PARTS.items()}
    return {"mode": mode, "saver": trainer.options.saver, "steps": steps,
            "step_s_without_saves": without_s / steps, "step_s_with_saves": with_saves_s / steps,
            "step_work_s_without_saves": cumulative_s(without, *STEP_WORK) / steps,
            "step_work_s_with_saves": cumulative_s(with_saves, *STEP_WORK) / steps,
            "per_save_s": parts,
            "saver_cpu_s_per_save_median": statistics.median(background) if background else None,
            "cpu_s_per_step": cpu, "unprofiled": split}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.save_profile",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per block")
    parser.add_argument("--rounds", type=int, default=SPLIT_ROUNDS,
                        help="interleaved rounds of the unprofiled blocks")
    parser.add_argument("--mode", choices=("async", "sync"), default="async")
    parser.add_argument("--saver", choices=("thread", "process"), default="thread",
                        help="ckpt.saver of the saves (async only)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1 (got {args.steps})")
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1 (got {args.rounds})")
    result = measure(args.steps, args.mode, args.overrides, args.saver, args.rounds)
    ms = lambda seconds: f"{seconds * 1e3:.2f} ms"  # noqa: E731
    print(f"default model, {result['steps']} steps per block, ckpt.mode={result['mode']}, "
          f"ckpt.saver={result['saver']}, under cProfile")
    print(f"step: {ms(result['step_s_without_saves'])} without saves, "
          f"{ms(result['step_s_with_saves'])} with a save after each")
    print(f"the step's own work (forward, backward, optimizer): "
          f"{ms(result['step_work_s_without_saves'])} without saves, "
          f"{ms(result['step_work_s_with_saves'])} with saves in flight")
    for label, seconds in result["per_save_s"].items():
        print(f"per save, training thread: {label}: {ms(seconds)}")
    saver = result["saver_cpu_s_per_save_median"]
    print(f"saver {result['saver']} CPU per save (median, its main thread): "
          + (ms(saver) if saver is not None else "none (sync)"))
    for block, label in (("without_saves", "without saves"), ("with_saves", "with a save after each")):
        cpu = result["cpu_s_per_step"][block]
        threads = ", ".join(f"{name} {ms(seconds)}" for name, seconds in cpu["threads"].items())
        print(f"CPU per step {label}, no profiler: {threads}; child processes (the saver "
              f"process) {ms(cpu['children'])}, of which in the kernel "
              f"{ms(cpu['children_system'])}")
    print_unprofiled(result["unprofiled"], ms)


def print_unprofiled(split: dict, ms) -> None:
    print(f"no profiler, {split['rounds']} interleaved rounds, medians: the step's own work "
          f"{ms(split['step_s']['without'])} wall, {ms(split['step_cpu_s']['without'])} CPU "
          f"without saves; {ms(split['step_s']['with'])} wall, {ms(split['step_cpu_s']['with'])} "
          f"CPU with saves in flight; building the save's payload {ms(split['payload_s'])}")
    for label, seconds in split["parts_s"].items():
        print(f"per save, training thread, no profiler (median of {split['saves']}): "
              f"{label}: {ms(seconds)}")


if __name__ == "__main__":
    main()
