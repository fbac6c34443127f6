"""A save's parts on the training thread, and the step beside the saves, with no profiler.

cProfile (the first blocks of experiments.save_profile) slows Python-heavy code, so its
milliseconds are shares, not costs. Here each part of the save call is timed by wrapping
the call on its object for a while (`timed_parts`), and the step's own work (forward,
backward, optimizer step, which waits for the staging copies) is timed step by step in
blocks without saves and with a save after each, interleaved (`step_split`). Together they
say where an every-step save's cost to the training thread goes: the call itself, the
payload the caller builds for it, and the step running slower while saves are in flight.
"""
from __future__ import annotations

import statistics
import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext

SAVE_CALL = "the save call (Checkpointer.save)"
PARTS = (  # label, whose call ("checkpointer", "engine": DeepSpeed's, "io": baton's), method
    (SAVE_CALL, "checkpointer", "save"),
    ("baton's capture (Checkpointer._capture)", "checkpointer", "_capture"),
    ("DeepSpeed's save_checkpoint", "engine", "save_checkpoint"),
    ("in it, baton's staging of the state (BatonCheckpointEngine.save)", "io", "save"),
    ("in it, the module's state dict (module_state_dict)", "engine", "module_state_dict"),
    ("in it, the common state, the optimizer's included (_common_checkpoint_state)", "engine",
     "_common_checkpoint_state"),
    ("baton's JSON payloads (BatonCheckpointEngine.save_json)", "io", "save_json"),
)


class PartTimes:
    """Seconds per part, summed per save (the JSON payloads are several calls a save)."""

    def __init__(self):
        self.saves: list[dict[str, float]] = []
        self._current: dict[str, float] = defaultdict(float)

    def add(self, label: str, seconds: float) -> None:
        self._current[label] += seconds
        if label == SAVE_CALL:  # the outermost part: this save is complete
            self.saves.append(dict(self._current))
            self._current = defaultdict(float)

    def medians(self) -> dict[str, float]:
        return {label: statistics.median(save.get(label, 0.0) for save in self.saves)
                for label, _, _ in PARTS}


@contextmanager
def timed_parts(trainer, times: PartTimes):
    """Inside, every call of each part (on `trainer`'s checkpointer, engine and baton's
    checkpoint engine) is timed into `times`; afterwards the calls are the classes' again."""
    owners = {"checkpointer": trainer.checkpointer, "engine": trainer.engine,
              "io": trainer.checkpointer.io}
    for label, owner, name in PARTS:
        original = getattr(owners[owner], name)

        def timed(*args, _original=original, _label=label, **kwargs):
            started = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                times.add(_label, time.perf_counter() - started)
        setattr(owners[owner], name, timed)  # on the instance: it shadows the class's method
    try:
        yield
    finally:
        for _, owner, name in PARTS:
            delattr(owners[owner], name)


def step_split(trainer, steps: int, rounds: int) -> dict:
    """Median per step of the training thread's wall and CPU seconds in `trainer.train(1)`,
    in blocks without saves and with a save after each (every other round in reverse), the
    payload's construction, and the save call's parts (PartTimes.medians)."""
    from bench.every_step import payload

    steps_s = {"without": [], "with": []}
    cpu_s = {"without": [], "with": []}
    payload_s: list[float] = []
    times = PartTimes()
    for index in range(rounds):
        for kind in (("without", "with") if index % 2 == 0 else ("with", "without")):
            # Wrapped for the whole block: training calls none of the parts.
            with timed_parts(trainer, times) if kind == "with" else nullcontext():
                for _ in range(steps):
                    started, cpu = time.perf_counter(), time.thread_time()
                    trainer.train(1)
                    steps_s[kind].append(time.perf_counter() - started)
                    cpu_s[kind].append(time.thread_time() - cpu)
                    if kind == "with":
                        started = time.perf_counter()
                        made = payload(trainer.step, trainer.tokens_per_step)
                        payload_s.append(time.perf_counter() - started)
                        trainer.checkpointer.save(trainer.step, made)
            trainer.checkpointer.drain()
    median = statistics.median
    return {"step_s": {kind: median(v) for kind, v in steps_s.items()},
            "step_cpu_s": {kind: median(v) for kind, v in cpu_s.items()},
            "payload_s": median(payload_s), "parts_s": times.medians(), "saves": len(times.saves),
            "rounds": rounds}
