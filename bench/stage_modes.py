"""Step time of one stage under named sets of overrides ("modes"), as ratios against a
baseline mode: the harness behind `baton bench repro` and `baton bench batch-invariant`.

Each run is a real `baton stage` in a fresh run directory, in its own process (a mode
may change what must be in place before torch loads). The modes alternate within each
round, the order rotating every round, so drift on a shared machine hits all alike. A
run's step time is the median of its per-step wall times (metrics.jsonl `seconds`),
leaving out the first step (start-up); evaluations and saves are moved past the last
step so they do not land in any step.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ModeBench:
    name: str
    """The `baton bench` action, for messages."""
    stage: str
    modes: dict[str, list[str]]
    """Mode name -> the overrides it passes to the stage; the first is the baseline."""
    what: str
    """What is measured, for the table's and the plot's titles."""
    fixed: list[str] = field(default_factory=list)
    """Overrides every run gets (e.g. a small RL batch)."""

    @property
    def baseline(self) -> str:
        return next(iter(self.modes))


def _one_run(bench: ModeBench, mode: str, steps: int, workdir: Path, overrides: list[str]) -> dict:
    run_dir = workdir / f"{mode}-{len(list(workdir.iterdir()))}"
    command = [sys.executable, "-m", "baton.cli", "stage", bench.stage, f"run.dir={run_dir}",
               *bench.fixed, *bench.modes[mode], f"stage.max_steps={steps}",
               f"stage.eval_every={steps + 1}", f"stage.save_every={steps + 1}",
               "mlflow.enabled=false", *overrides]
    done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ))
    if done.returncode != 0:
        raise RuntimeError(f"bench {bench.name}: `{' '.join(command)}` failed ({done.returncode}):\n"
                           + done.stderr[-2000:])
    lines = (run_dir / bench.stage / "metrics.jsonl").read_text().splitlines()
    times = [rec["seconds"] for rec in map(json.loads, lines) if rec["step"] > 1 and "loss" in rec]
    return {"mode": mode, "step_s": statistics.median(times), "steps_timed": len(times)}


def run_mode_bench(bench: ModeBench, rounds: int, steps: int, overrides: list[str] | None = None,
                   progress=print) -> dict:
    runs: list[dict] = []
    names = list(bench.modes)
    with tempfile.TemporaryDirectory(prefix=f"baton-bench-{bench.name}-") as scratch:
        for round_index in range(rounds):
            shift = round_index % len(names)
            for mode in names[shift:] + names[:shift]:
                run = {**_one_run(bench, mode, steps, Path(scratch), list(overrides or [])),
                       "round": round_index + 1}
                runs.append(run)
                progress(f"[bench {bench.name}] round {round_index + 1}/{rounds} {mode:16s} "
                         f"{run['step_s'] * 1000:.1f} ms/step")
    summary = {}
    for mode in names:
        times = [r["step_s"] for r in runs if r["mode"] == mode]
        summary[mode] = {"step_s_min": min(times), "step_s_median": statistics.median(times)}
    base = summary[bench.baseline]
    ratios = {mode: {stat: summary[mode][f"step_s_{stat}"] / base[f"step_s_{stat}"]
                     for stat in ("min", "median")} for mode in names if mode != bench.baseline}
    return {"stage": bench.stage, "rounds": rounds, "steps": steps, "runs": runs,
            "summary": summary, "baseline": bench.baseline, f"over_{bench.baseline}": ratios}


def report_lines(bench: ModeBench, result: dict, machine: str) -> list[str]:
    s, base = result["summary"], bench.baseline
    ratios = result[f"over_{base}"]

    def ratio(mode, stat):
        return "1 (the baseline)" if mode == base else f"{ratios[mode][stat]:.2f}×"
    return [
        f"{bench.what}, `baton stage {result['stage']}` with the default model, {result['steps']} "
        f"steps, {result['rounds']} interleaved rounds, on {machine}:", "",
        f"| mode | step time min | median | ÷ {base}, min | ÷ {base}, median |", "|---|---|---|---|---|",
        *(f"| {m} | {s[m]['step_s_min'] * 1000:.1f} ms | {s[m]['step_s_median'] * 1000:.1f} ms | "
          f"{ratio(m, 'min')} | {ratio(m, 'median')} |" for m in bench.modes)]


def write_plot(bench: ModeBench, result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = 0.8 / len(bench.modes)
    fig, ax = plt.subplots(figsize=(6.5, 3.5))
    for index, mode in enumerate(bench.modes):
        offset = (index - (len(bench.modes) - 1) / 2) * width
        runs = [r for r in result["runs"] if r["mode"] == mode]
        ax.bar([r["round"] + offset for r in runs], [r["step_s"] * 1000 for r in runs], width, label=mode)
    ax.set_xlabel("round")
    ax.set_ylabel("median step time (ms)")
    ax.set_title(f"{bench.what} per {result['stage']} step ({result.get('machine', 'this machine')})",
                 fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
