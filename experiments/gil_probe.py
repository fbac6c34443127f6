"""What background work costs the default model's training step, by whether it holds the GIL.

    python -m experiments.gil_probe [--duty 0.25] [--rounds 3] [--steps 20] [overrides]

Background work runs `duty` of the time, in 25 ms periods, while the default model
trains: pure-Python work on a thread (which holds the GIL), the same duty of hashing
1 MiB buffers on a thread (`hashlib` releases the GIL for inputs that large), or the same
Python work in a separate process (its own GIL, the other core). Blocks without background
work and with each kind are interleaved, `--rounds` times; each ratio is throughput with
the work over throughput without, min and median.

It also times the model's backward passes in the blocks without background work and in
those with the Python thread (median milliseconds): autograd's engine runs without the
GIL yet takes it back between nodes, so a backward is no window in which a thread's
Python runs for free (docs/async_checkpoints.md, "Tried and not kept").

Why it exists: the default model's step is bound by one core running Python, so the
saver's Python competes with it for the GIL, not only for a core. The probe tells the two
costs apart on the machine it runs on, and the process kind shows what moving the saver's
Python out of the training process would leave; docs/async_checkpoints.md uses it to say
where a save's remaining cost is and what would remove it.
"""
from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import shutil
import statistics
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

PERIOD_S = 0.025


def busy_loop(kind: str, duty: float, stop) -> None:
    """Work `duty` of each period until `stop` is set: Python loops, or hashing."""
    buffer = os.urandom(1 << 20)
    busy, idle = PERIOD_S * duty, PERIOD_S * (1 - duty)
    while not stop.is_set():
        started = time.perf_counter()
        while time.perf_counter() - started < busy:
            if kind == "gil_free":
                hashlib.sha256(buffer).digest()
            else:
                total = 0
                for value in range(1000):
                    total += value
        stop.wait(idle)


class Load:
    """Background work for one block: a thread (python, gil_free) or a child process
    (process: Python in its own interpreter), stopped and joined when the block ends."""

    def __init__(self, kind: str, duty: float):
        if kind == "process":
            context = multiprocessing.get_context("spawn")  # no copy of the trainer's threads
            self.stop = context.Event()
            self.worker = context.Process(target=busy_loop, args=("python", duty, self.stop),
                                          name="gil-probe-process", daemon=True)
        else:
            self.stop = threading.Event()
            self.worker = threading.Thread(target=busy_loop, args=(kind, duty, self.stop),
                                           name=f"gil-probe-{kind}", daemon=True)

    def __enter__(self):
        self.worker.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.worker.join(timeout=10)
        if isinstance(self.worker, multiprocessing.process.BaseProcess) and self.worker.is_alive():
            self.worker.kill()  # ours, by its handle: never left running after the probe
            self.worker.join()


class BackwardTimes:
    """Seconds of each `engine.backward` call, by the kind of block it ran in (an instance
    attribute over DeepSpeed's method, removed by `close`)."""

    def __init__(self, engine):
        self.engine, self.kind = engine, None
        self.seconds: dict[str, list[float]] = {}
        timed = engine.backward

        def backward(*args, **kwargs):
            started = time.perf_counter()
            try:
                return timed(*args, **kwargs)
            finally:
                if self.kind is not None:
                    self.seconds.setdefault(self.kind, []).append(time.perf_counter() - started)

        engine.backward = backward

    @contextmanager
    def into(self, kind: str):
        self.kind = kind
        try:
            yield
        finally:
            self.kind = None

    def median_ms(self, kind: str) -> float:
        return statistics.median(self.seconds[kind]) * 1e3

    def close(self) -> None:
        del self.engine.backward


def measure(duty: float, rounds: int, steps: int, overrides: list[str]) -> dict:
    from bench.console import progress, stdout_to_stderr
    from bench.state import build_state
    from bench.training import TokenBatches, train_steps

    workdir = Path(tempfile.mkdtemp(prefix="baton-gil-probe-"))
    with stdout_to_stderr():
        state = build_state("default model", overrides, workdir / "model", None)
    engine, stage = state.engine, state.cfg.stage
    batches = TokenBatches(stage, engine.module.config.vocab_size, seed=1)
    backward = BackwardTimes(engine)

    def block(kind: str | None) -> float:
        started = time.perf_counter()
        if kind is None:
            with backward.into("alone"):
                train_steps(engine, stage, steps, batches)
        else:
            with Load(kind, duty), backward.into(kind):
                train_steps(engine, stage, steps, batches)
        return time.perf_counter() - started

    ratios: dict[str, list[float]] = {"python": [], "gil_free": [], "process": []}
    try:
        block(None)  # warm-up
        kinds = list(ratios)
        for index in range(rounds):
            alone = block(None)
            for kind in kinds[index % 3:] + kinds[:index % 3]:  # rotate which goes first
                ratios[kind].append(alone / block(kind))
            progress(f"gil probe round {index + 1}/{rounds}: step {alone / steps * 1e3:.1f} ms "
                     + ", ".join(f"{k} {v[-1]:.3f}×" for k, v in ratios.items()))
    finally:
        backward.close()
        state.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return {"duty": duty, "rounds": rounds, "steps_per_block": steps,
            "backward_ms_median_alone": backward.median_ms("alone"),
            "backward_ms_median_beside_python": backward.median_ms("python"),
            **{f"{kind}_throughput_ratio_{stat}": fn(values) for kind, values in ratios.items()
               for stat, fn in (("min", min), ("median", statistics.median))}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.gil_probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--duty", type=float, default=0.25, help="busy fraction of each 25 ms period")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per block")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    if not 0 < args.duty < 1 or args.rounds < 3 or args.steps < 1:
        parser.error(f"--duty must lie in (0, 1) (got {args.duty}), --rounds at least 3 "
                     f"(got {args.rounds}), --steps at least 1 (got {args.steps})")
    result = measure(args.duty, args.rounds, args.steps, args.overrides)
    print(f"background work {result['duty']:.0%} of the time, default model "
          f"({result['rounds']} rounds of {result['steps_per_block']} steps), throughput ratio "
          f"min / median: Python (holds the GIL) {result['python_throughput_ratio_min']:.3f} / "
          f"{result['python_throughput_ratio_median']:.3f}; GIL-free "
          f"{result['gil_free_throughput_ratio_min']:.3f} / {result['gil_free_throughput_ratio_median']:.3f}; "
          f"Python in another process {result['process_throughput_ratio_min']:.3f} / "
          f"{result['process_throughput_ratio_median']:.3f}")
    print(f"backward, median: {result['backward_ms_median_alone']:.1f} ms alone, "
          f"{result['backward_ms_median_beside_python']:.1f} ms beside the Python thread")


if __name__ == "__main__":
    main()
