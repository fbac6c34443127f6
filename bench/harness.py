"""Prepare every method, then time their saves round-robin: round r runs each method once
(starting one further along each round, so no method always follows the same neighbour),
and each save is timed by the harness alike: the stall until `save` and `before_update`
return (nothing to hide the copy behind), the time until `wait_durable` returns from the
same start, the bytes written, and the peak memory.

Then the same rounds again with a training step around each save (`bench.training.
TrainingStep`): the save, the step's forward and backward, `before_update`, the update. The
stall in a step is the save call plus the wait before the update: what a save costs a
training run whose forward and backward can hide a lazy staging copy."""
from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass, field

from bench.console import gb, one_line, progress, stdout_to_stderr
from bench.memory import PeakSampler, settle, total_rss
from bench.methods.base import SaveMethod


@dataclass
class Measured:
    name: str
    bound: bool
    resident_extra_rss_bytes: int
    """Memory the method holds between saves (staging buffers, a writer process)."""
    stall_s: list[float] = field(default_factory=list)
    durable_s: list[float] = field(default_factory=list)
    bytes: list[int] = field(default_factory=list)
    save_extra_rss_bytes: list[int] = field(default_factory=list)
    step_stall_s: list[float] = field(default_factory=list)
    """Stall of a save inside a training step (the save call + the wait before the update)."""
    step_compute_s: list[float] = field(default_factory=list)
    """That step's forward and backward, slowed by whatever the save runs beside them."""

    def summary(self) -> dict:
        in_step = {}
        if self.step_stall_s:
            in_step = {"step_stall_s_min": min(self.step_stall_s),
                       "step_stall_s_median": statistics.median(self.step_stall_s),
                       "step_compute_s_min": min(self.step_compute_s),
                       "step_compute_s_median": statistics.median(self.step_compute_s)}
        return {
            "name": self.name,
            "stall_s_min": min(self.stall_s), "stall_s_median": statistics.median(self.stall_s),
            "durable_s_min": min(self.durable_s),
            "durable_s_median": statistics.median(self.durable_s),
            "bytes": int(statistics.median(self.bytes)),
            "peak_extra_rss_bytes": self.resident_extra_rss_bytes + max(self.save_extra_rss_bytes),
            "resident_extra_rss_bytes": self.resident_extra_rss_bytes,
            "save_extra_rss_bytes": max(self.save_extra_rss_bytes),
            "rounds": len(self.stall_s),
            **in_step,
        }


@dataclass
class Outcome:
    measured: list[Measured]
    unavailable: list[dict]
    """{"name", "reason"} of methods that did not start here or failed during a round."""


def timed_save(method: SaveMethod) -> tuple[float, float, int]:
    """(stall_s, durable_s, peak extra bytes) of one save."""
    settle()
    with PeakSampler(method.children()) as peak:
        start = time.perf_counter()
        method.save()
        method.before_update()  # a lazy copy: with no step to hide it, the wait is all of it
        stall = time.perf_counter() - start
        method.wait_durable()
        durable = time.perf_counter() - start
    return stall, durable, peak.extra


def timed_step_save(method: SaveMethod, step) -> tuple[float, float]:
    """(stall_s, compute_s) of one save inside a training step."""
    settle()
    start = time.perf_counter()
    method.save()
    saved = time.perf_counter()
    step.forward_backward()
    computed = time.perf_counter()
    method.before_update()
    waited = time.perf_counter()
    step.update()
    method.wait_durable()
    return (saved - start) + (waited - computed), computed - saved


def prepare(method: SaveMethod, state, directory) -> Measured:
    """Start the method and run one warm-up save (first-save costs such as allocating
    staging buffers or spawning a writer process are not what a training run pays per
    save); what it then holds is its resident memory."""
    settle()
    before = total_rss([])
    method.prepare(state, directory)
    method.save()
    method.wait_durable()
    method.cleanup()
    settle()
    resident = max(total_rss(method.children()) - before, 0)
    return Measured(method.name, method.bound, resident)


def run_interleaved(methods: list[SaveMethod], state, root, rounds: int, label: str,
                    step=None) -> Outcome:
    """`step`: a bench.training.TrainingStep for the in-step rounds (None: none)."""
    # A full collection walks every object torch, transformers and DeepSpeed made (about
    # 0.3 s here); frozen, they are skipped, so `settle` before each save stays cheap.
    gc.freeze()
    try:
        return _interleaved(methods, state, root, rounds, label, step)
    finally:
        gc.unfreeze()


def _interleaved(methods: list[SaveMethod], state, root, rounds: int, label: str,
                 step) -> Outcome:
    shared = [m for m in methods if not m.isolated]
    outcome = _rounds(shared, state, root, rounds, label, step)
    for method in (m for m in methods if m.isolated):
        alone = _rounds([method], state, root, rounds, f"{label} (alone)", step)
        close_quietly(method)  # its writer process would slow whatever runs next
        outcome.measured += alone.measured
        outcome.unavailable += alone.unavailable
    order = {m.name: i for i, m in enumerate(methods)}
    outcome.measured.sort(key=lambda m: order[m.name])
    return outcome


def _rounds(methods: list[SaveMethod], state, root, rounds: int, label: str, step) -> Outcome:
    ready, unavailable = _prepare_all(methods, state, root, label)
    passes = [(_measure, "round")] + ([(_measure_in_step(step), "in-step round")] if step else [])
    for measure, kind in passes:
        for index in range(rounds):
            shift = index % max(len(ready), 1)
            for method, measured in ready[shift:] + ready[:shift]:
                if measured.name in {u["name"] for u in unavailable}:
                    continue
                try:
                    measure(method, measured, f"{label} {kind} {index + 1}/{rounds}")
                except Exception as exc:  # one broken method must not cost the others' numbers
                    unavailable.append({"name": method.name,
                                        "reason": f"failed in {kind} {index + 1}: {one_line(exc)}"})
                    progress(f"{label} {method.name}: failed: {one_line(exc)}")
    failed = {u["name"] for u in unavailable}
    return Outcome([m for _, m in ready if m.name not in failed], unavailable)


def _prepare_all(methods: list[SaveMethod], state, root, label: str):
    ready: list[tuple[SaveMethod, Measured]] = []
    unavailable: list[dict] = []
    for method in methods:
        try:
            with stdout_to_stderr():
                ready.append((method, prepare(method, state, root / slug(method.name))))
        except Exception as exc:  # the reason is the report: a method that does not start here
            unavailable.append({"name": method.name, "reason": one_line(exc)})
            progress(f"{label} {method.name}: unavailable: {one_line(exc)}")
            close_quietly(method)
    return ready, unavailable


def _measure(method: SaveMethod, measured: Measured, where: str) -> None:
    with stdout_to_stderr():
        stall, durable, extra = timed_save(method)
        nbytes = method.saved_bytes()
        method.cleanup()
    measured.stall_s.append(stall)
    measured.durable_s.append(durable)
    measured.bytes.append(nbytes)
    measured.save_extra_rss_bytes.append(extra)
    progress(f"{where} {method.name}: stall {stall:.3f} s, durable {durable:.3f} s, "
             f"{gb(nbytes)}, peak +{gb(extra)} RSS")


def _measure_in_step(step):
    def measure(method: SaveMethod, measured: Measured, where: str) -> None:
        with stdout_to_stderr():
            stall, compute = timed_step_save(method, step)
            method.cleanup()
        measured.step_stall_s.append(stall)
        measured.step_compute_s.append(compute)
        progress(f"{where} {method.name}: stall in a step {stall:.4f} s "
                 f"(forward+backward {compute:.3f} s)")

    return measure


def close_all(methods: list[SaveMethod]) -> None:
    for method in methods:
        close_quietly(method)


def close_quietly(method: SaveMethod) -> None:
    try:
        with stdout_to_stderr():
            method.close()
    except Exception as exc:  # closing must not hide the measurements already made
        progress(f"closing {method.name}: {one_line(exc)}")


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name).strip("-")
