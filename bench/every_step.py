"""Checkpoint every step: training throughput with a baton save after every optimizer step,
divided by the throughput with none, in alternating blocks on the same engine.

A block with saves is timed from its first step to the return of its last save; the
saves still in flight then are drained before the next block (a block without saves must
not pay for them), so the figure is the steady state of a long run.

A third kind of block, interleaved with the two, measures the bound: after each step the
state's bytes are copied into one preallocated buffer and a background thread writes
them to one file and fsyncs it, one save in flight. No checkpoint can save the same
bytes durably every step for less; the gap between the two ratios is what baton's own
work (structure, many files, the commit) costs on this machine.

A fourth kind measures the I/O floor: the same write + fsync every step, of a buffer
filled once, with no copy on the training thread. It is what making as many bytes
durable every step costs the step on this machine by itself (the kernel's page-cache
copy, writeback, and the second core they take), whatever the checkpoint does: where
this ratio is below 0.97, no checkpoint that writes these bytes durably every step can
cost 3% or less.

Probes that split a save's cost further (the commit floor, the DeepSpeed floor, the saver
process's worker side) were experiments, not product: experiments/README.md says where they
are.
"""
from __future__ import annotations

import statistics
import time
from contextlib import ExitStack
from functools import partial
from pathlib import Path

from bench.bootstrap import ratio_interval
from bench.console import progress, stdout_to_stderr
from bench.methods.baton_checkpointer import payload, save_options
from bench.raw_every_step import RawWriteEveryStep
from bench.training import TokenBatches, accumulation, train_steps


SAVERS = ("thread", "process")
"""Where the async saves are finished (ckpt.saver): each measured in the same run."""


class SavingTrainer:
    """Optimizer steps on the bench state, with or without a baton save after each.
    Several may share one engine (one per saver): `activate` hands the engine's
    checkpoint engine to this one's checkpointer before its block."""

    def __init__(self, state, directory: Path, mode: str, saver: str | None = None):
        from dataclasses import replace

        from ckpt.checkpointer import Checkpointer

        self.engine, self.stage = state.engine, state.cfg.stage
        self.options = save_options(state.cfg, mode)
        if saver is not None:
            self.options = replace(self.options, saver=saver)
        self.batches = TokenBatches(self.stage, self.engine.module.config.vocab_size, seed=1)
        self.tokens_per_step = self.batches.tokens * accumulation(self.engine)
        self.checkpointer = Checkpointer(self.engine, directory, self.stage.name, state.layout,
                                         keep_last=2, options=self.options)
        self.step = 0

    def activate(self) -> None:
        self.engine.checkpoint_engine = self.checkpointer.io

    def train(self, steps: int) -> None:
        train_steps(self.engine, self.stage, steps, self.batches)
        self.step += steps

    def train_and_save(self, steps: int) -> None:
        for _ in range(steps):
            self.train(1)
            self.checkpointer.save(self.step, payload(self.step, self.tokens_per_step))


class Rounds:
    """The timed blocks of one every-step run, by kind: without saves, with saves (one
    kind per saver), with the bound's copy and write, and with the I/O floor's write
    alone; seconds, and the training thread's CPU."""

    def __init__(self, trainers: dict[str, SavingTrainer], bound: RawWriteEveryStep,
                 floor: RawWriteEveryStep, steps_per_block: int):
        self.trainers, self.bound, self.floor = trainers, bound, floor
        self.first = next(iter(trainers.values()))
        self.steps = steps_per_block
        self.without: list[float] = []
        self.with_bound: list[float] = []
        self.with_floor: list[float] = []
        self.with_saves: dict[str, list[float]] = {saver: [] for saver in trainers}
        self.cpu = {"without": [], **{saver: [] for saver in trainers}}

    def kinds(self) -> list:
        return [self.block_without, *(partial(self.block_with, saver) for saver in self.trainers),
                partial(self.block_raw, self.bound, self.with_bound),
                partial(self.block_raw, self.floor, self.with_floor)]

    def block_without(self) -> None:
        self.without.append(_timed(self.first.train, self.steps, self.cpu["without"]))

    def block_with(self, saver: str) -> None:
        self._saving(self.trainers[saver], self.with_saves[saver], self.cpu[saver])

    def _saving(self, trainer: SavingTrainer, seconds: list[float], cpu: list[float]) -> None:
        """A block with a save after every step by `trainer`, then its saves drained."""
        trainer.activate()
        seconds.append(_timed(trainer.train_and_save, self.steps, cpu))
        trainer.checkpointer.drain()

    def block_raw(self, raw, seconds: list[float]) -> None:
        """A block of the bound's kind or the I/O floor's: `raw.save()` after every step."""
        seconds.append(_timed(partial(self._train_and_write, raw), self.steps))
        raw.drain()

    def _train_and_write(self, raw, steps: int) -> None:
        for _ in range(steps):
            self.first.train(1)
            raw.save()

    def last_rates(self) -> str:
        rates = ", ".join(f"{self.steps / self.with_saves[saver][-1]:.3g} with a save every "
                          f"step ({saver} saver)" for saver in self.trainers)
        return (f"{self.steps / self.without[-1]:.3g} steps/s without saves, {rates}, "
                f"{self.steps / self.with_bound[-1]:.3g} with the bound's write, "
                f"{self.steps / self.with_floor[-1]:.3g} with the I/O floor's")


def run_every_step(state, directory: Path, mode: str, steps_per_block: int, blocks: int,
                   label: str, savers: tuple[str, ...] = SAVERS) -> dict[str, dict]:
    """{saver: summary}: blocks without saves, then one block with saves per saver, then
    the bound's block and the I/O floor's, in turn (every other round in reverse),
    `blocks` times (async: one saver per ckpt.saver; sync has no saver, so one kind of
    block with saves)."""
    if mode != "async":
        savers = savers[:1]
    with stdout_to_stderr():
        trainers = {saver: SavingTrainer(state, directory / saver, mode, saver) for saver in savers}
    bound = RawWriteEveryStep(state, directory)
    floor = RawWriteEveryStep(state, directory, copy=False)
    closeables = [bound, floor, *(t.checkpointer for t in trainers.values())]
    try:
        with stdout_to_stderr():
            for trainer in trainers.values():  # warm-up: the first save allocates the
                trainer.activate()  # staging buffers (and starts the saver process)
                trainer.train_and_save(1)
                trainer.checkpointer.drain()
        rounds = Rounds(trainers, bound, floor, steps_per_block)
        kinds = rounds.kinds()
        for index in range(blocks):
            with stdout_to_stderr():
                # Every other round in reverse order: a machine that speeds up or slows
                # down across the run then favours no kind of block.
                for block in (kinds if index % 2 == 0 else kinds[::-1]):
                    block()
            progress(f"{label} every-step block {index + 1}/{blocks} ({mode}): {rounds.last_rates()}")
    finally:
        # Each closed even when one before it raised: no saver process, write thread or
        # file is left behind by a failed run.
        with ExitStack() as closing:
            closing.enter_context(stdout_to_stderr())
            for closeable in closeables:
                closing.callback(closeable.close)
    return {saver: summary(trainer, state, rounds, saver) for saver, trainer in trainers.items()}


def summary(trainer: SavingTrainer, state, rounds: Rounds, saver: str) -> dict:
    stats = trainer.checkpointer.stats[1:]  # the warm-up save is not one of the measured
    steps_per_block, without = rounds.steps, rounds.without
    with_saves, cpu = rounds.with_saves[saver], rounds.cpu
    steps = steps_per_block * len(without)
    step_s = statistics.median(without) / steps_per_block
    return {
        "mode": trainer.options.mode, "saver": trainer.options.saver,
        "writer": trainer.options.writer, "params": state.params(),
        "state_bytes": state.nbytes(), "steps_per_block": steps_per_block, "blocks": len(without),
        "tokens_per_step": trainer.tokens_per_step,
        "steps_per_s_without_saves": steps / sum(without),
        "steps_per_s_with_saves": steps / sum(with_saves),
        "throughput_ratio": sum(without) / sum(with_saves),
        # How far the ratio moves when the rounds are resampled (bench.bootstrap says why).
        "throughput_ratio_ci95": ratio_interval(without, with_saves),
        # Against the bound's blocks instead: what baton costs beyond copying the bytes and
        # writing them durably, whatever running I/O beside training does to the step here.
        "throughput_ratio_vs_bound": sum(rounds.with_bound) / sum(with_saves),
        "throughput_ratio_vs_bound_ci95": ratio_interval(rounds.with_bound, with_saves),
        "block_ratios": [w / s for w, s in zip(without, with_saves)],
        # The median round: what one round of blocks most often shows (the sums above weigh
        # a slow round more).
        "block_ratio_median": statistics.median(w / s for w, s in zip(without, with_saves)),
        # The same with only a memcpy + one raw write + fsync of the state's bytes every step.
        **_versus("bound", rounds.with_bound, without, steps),
        # The same write + fsync of a buffer filled once, no copy: what the I/O alone costs.
        **_versus("floor", rounds.with_floor, without, steps),
        "step_s_median": step_s,
        "save_stall_s_median": statistics.median(s["stall_s"] for s in stats),
        "save_slot_wait_s_median": statistics.median(s["slot_wait_s"] for s in stats),
        "save_durable_s_median": statistics.median(s["durable_s"] for s in stats),
        # The saver's CPU per save (its thread, or the saver process's main thread): on
        # the saver thread, Python there holds the GIL the step needs (`python -m
        # experiments.gil_probe` measured what that costs on this machine).
        "save_background_cpu_s_median": _median_or_none(s["background_cpu_s"] for s in stats),
        # The training thread's own CPU per step, without and with saves: the difference
        # is the save call plus what sharing the GIL and the cores costs the step itself.
        "train_thread_cpu_s_per_step_without_saves": sum(cpu["without"]) / steps,
        "train_thread_cpu_s_per_step_with_saves": sum(cpu[saver]) / steps,
    }


def _versus(name: str, blocks: list[float], without: list[float], steps: int) -> dict:
    """Throughput of one kind of block against the blocks without saves: the sum, each
    round's ratio, and the median round's."""
    ratios = [w / b for w, b in zip(without, blocks)]
    return {f"steps_per_s_with_{name}": steps / sum(blocks),
            f"{name}_throughput_ratio": sum(without) / sum(blocks),
            f"{name}_throughput_ratio_ci95": ratio_interval(without, blocks),
            f"{name}_block_ratios": ratios, f"{name}_block_ratio_median": statistics.median(ratios)}


def _median_or_none(values) -> float | None:
    """None when nothing was measured (a sync save has no saver thread)."""
    found = [value for value in values if value is not None]
    return statistics.median(found) if found else None


def _timed(work, steps: int, cpu: list[float] | None = None) -> float:
    """Wall seconds of `work(steps)`; with `cpu`, appends this (the training) thread's CPU."""
    start, start_cpu = time.perf_counter(), time.thread_time()
    work(steps)
    if cpu is not None:
        cpu.append(time.thread_time() - start_cpu)
    return time.perf_counter() - start
