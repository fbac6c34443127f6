"""`baton bench repro`: what portable mode (core.repro) costs against native, per training step.

Each run is a real `baton stage` of the given stage with the default model, in a fresh run
directory, in its own process (the kernel pinning must be in place before torch loads).
Native and portable alternate within each round, the order flipping every round, so
drift on a shared machine hits both alike. A run's step time is the median of its
per-step wall times (metrics.jsonl `seconds`), leaving out the first step (start-up);
evaluations and saves are moved past the last step so they do not land in any step.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# What each timed mode passes to the stage; ratios are against native.
MODES = {"native": ["repro.mode=native"],
         "portable-avx2": ["repro.mode=portable", "repro.isa=avx2"],
         "portable-baseline": ["repro.mode=portable", "repro.isa=baseline"]}


def _one_run(stage: str, mode: str, steps: int, workdir: Path, overrides: list[str]) -> dict:
    run_dir = workdir / f"{mode}-{len(list(workdir.iterdir()))}"
    command = [sys.executable, "-m", "baton.cli", "stage", stage, f"run.dir={run_dir}",
               *MODES[mode], f"stage.max_steps={steps}", f"stage.eval_every={steps + 1}",
               f"stage.save_every={steps + 1}", "mlflow.enabled=false", *overrides]
    done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ))
    if done.returncode != 0:
        raise RuntimeError(f"bench repro: `{' '.join(command)}` failed ({done.returncode}):\n"
                           + done.stderr[-2000:])
    records = [json.loads(line) for line in (run_dir / stage / "metrics.jsonl").read_text().splitlines()]
    times = [rec["seconds"] for rec in records if rec["step"] > 1 and "loss" in rec]
    return {"mode": mode, "step_s": statistics.median(times), "steps_timed": len(times)}


def run_repro_bench(stage: str = "cpt", rounds: int = 3, steps: int = 20,
                    overrides: list[str] | None = None, progress=print) -> dict:
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="baton-bench-repro-") as scratch:
        for round_index in range(rounds):
            names = list(MODES)
            order = names[round_index % len(names):] + names[:round_index % len(names)]
            for mode in order:
                run = {**_one_run(stage, mode, steps, Path(scratch), list(overrides or [])),
                       "round": round_index + 1}
                runs.append(run)
                progress(f"[bench repro] round {round_index + 1}/{rounds} {mode:8s} "
                         f"{run['step_s'] * 1000:.1f} ms/step")
    summary = {}
    for mode in MODES:
        times = [r["step_s"] for r in runs if r["mode"] == mode]
        summary[mode] = {"step_s_min": min(times), "step_s_median": statistics.median(times)}
    ratios = {mode: {stat: summary[mode][f"step_s_{stat}"] / summary["native"][f"step_s_{stat}"]
                     for stat in ("min", "median")} for mode in MODES if mode != "native"}
    return {"stage": stage, "rounds": rounds, "steps": steps, "runs": runs, "summary": summary,
            "over_native": ratios}


def report_lines(result: dict, machine: str) -> list[str]:
    s, ratios = result["summary"], result["over_native"]

    def ratio(mode, stat):
        return "1 (the baseline)" if mode == "native" else f"{ratios[mode][stat]:.2f}×"
    return [
        f"repro.mode cost, `baton stage {result['stage']}` with the default model, {result['steps']} "
        f"steps, {result['rounds']} interleaved rounds, on {machine}:", "",
        "| mode | step time min | median | ÷ native, min | ÷ native, median |", "|---|---|---|---|---|",
        *(f"| {m} | {s[m]['step_s_min'] * 1000:.1f} ms | {s[m]['step_s_median'] * 1000:.1f} ms | "
          f"{ratio(m, 'min')} | {ratio(m, 'median')} |" for m in MODES)]


def write_plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.5))
    for offset, mode in zip((-0.27, 0, 0.27), MODES):
        runs = [r for r in result["runs"] if r["mode"] == mode]
        ax.bar([r["round"] + offset for r in runs], [r["step_s"] * 1000 for r in runs], 0.27, label=mode)
    ax.set_xlabel("round")
    ax.set_ylabel("median step time (ms)")
    ax.set_title(f"repro.mode cost per {result['stage']} step ({result.get('machine', 'this machine')})",
                 fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
