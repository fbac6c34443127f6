"""`baton report RUN_DIR`: a pipeline run's results as markdown, from its records only.

Every number comes from the lineage store (handoffs, checkpoints, environment
fingerprints) or the stages' own metrics files, so a results table in the README is
regenerated, never typed. The same run reproduced elsewhere in portable mode gives the
same report, except the lines that say where and when (run directory, timing).
"""
from __future__ import annotations

import json
from pathlib import Path

from lineage import records as r

RL_WINDOW = 10
"""Training reward and entropy are reported as means over the first and last this many steps."""


def _metrics(checkpoint_path: str) -> list[dict]:
    path = Path(checkpoint_path).parents[1] / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _fmt(value) -> str:
    return f"{value:.3f}" if isinstance(value, float) else ("–" if value is None else str(value))


def environment_section(fingerprint: dict | None) -> list[str]:
    if not fingerprint:
        return ["No environment fingerprint was recorded for this run."]
    cpu, versions = fingerprint.get("cpu") or {}, fingerprint.get("versions") or {}
    return [
        f"- repro.mode **{fingerprint.get('repro_mode')}**; ATen CPU capability "
        f"{fingerprint.get('cpu_capability')}; {(fingerprint.get('threads') or {}).get('intra_op')} "
        f"thread(s) per process",
        f"- CPU: {cpu.get('model')} (ISA: {' '.join(cpu.get('flags') or [])})",
        f"- torch {versions.get('torch')}, DeepSpeed {versions.get('deepspeed')}, transformers "
        f"{versions.get('transformers')}, Python {versions.get('python')}; code {fingerprint.get('code')}"]


def handoff_section(handoffs: list[r.Handoff]) -> list[str]:
    lines = ["| handoff | criterion | chosen | entropy | why (as recorded) |", "|---|---|---|---|---|"]
    for h in handoffs:
        lines.append(f"| {h.from_stage.upper()} → {h.to_stage.upper()} | {h.criterion} | step "
                     f"{h.chosen_step} | {_fmt(h.entropy)} | {h.reason} |")
    return lines


def rl_section(records: list[dict]) -> list[str]:
    evals = [rec for rec in records if "eval_reward" in rec]
    if not evals:
        return ["The RL stage recorded no held-out evaluation."]
    lines = ["| held-out, step | " + " | ".join(str(rec["step"]) for rec in evals) + " |",
             "|---|" + "---|" * len(evals),
             "| mean task reward (sampled) | " + " | ".join(_fmt(rec["eval_reward"]) for rec in evals) + " |",
             "| greedy accuracy | " + " | ".join(_fmt(rec["eval_accuracy"]) for rec in evals) + " |"]
    steps = [rec for rec in records if "reward" in rec and rec.get("step", 0) > 0]
    if len(steps) >= 2 * RL_WINDOW:
        first, last = steps[:RL_WINDOW], steps[-RL_WINDOW:]

        def mean(rows, key):
            return sum(row[key] for row in rows) / len(rows)
        lines += ["", f"Training reward, mean of steps {first[0]['step']}–{first[-1]['step']}: "
                  f"{mean(first, 'reward'):.3f}; of steps {last[0]['step']}–{last[-1]['step']}: "
                  f"{mean(last, 'reward'):.3f}. Sampling entropy: {mean(first, 'entropy'):.3f} → "
                  f"{mean(last, 'entropy'):.3f}."]
    return lines


def checkpoint_section(finals: list[r.Checkpoint]) -> list[str]:
    lines = ["| stage | final step | content digest |", "|---|---|---|"]
    for c in finals:
        lines.append(f"| {c.stage.upper()} | {c.step} | `{c.content_digest or 'not recorded'}` |")
    return lines


def pipeline_stage_runs(store, pipeline: r.PipelineRun) -> list[r.StageRun]:
    """Per stage, the newest completed attempt of the pipeline itself; `baton rerun`
    attempts (recorded with a `rerun` event) check the record, they are not results."""
    chosen: dict[str, r.StageRun] = {}
    for run in store.stage_runs(pipeline.id):
        if run.status == "completed" and not any(e.kind == "rerun" for e in store.events(run.id)):
            chosen[run.stage] = run
    return list(chosen.values())


def pipeline_report(store, pipeline: r.PipelineRun) -> str:
    """The markdown; nothing in it depends on where the run directory is, so two
    reproductions of one pipeline give the same text."""
    finals, rl_records, fingerprint = [], [], None
    for run in pipeline_stage_runs(store, pipeline):
        kept = [c for c in store.checkpoints(run.id) if c.committed]
        if kept:
            finals.append(kept[-1])
            if run.stage == "rl":
                rl_records = _metrics(kept[-1].path)
        fingerprint = run.environment or fingerprint
    sections = [
        f"### Pipeline run {pipeline.id} ({pipeline.status}), seed {pipeline.seed}",
        "", *environment_section(fingerprint), "", "#### Handoffs", "",
        *handoff_section(store.handoffs(pipeline.id)), "", "#### RL", "", *rl_section(rl_records),
        "", "#### Final checkpoints", "", *checkpoint_section(finals)]
    return "\n".join(sections) + "\n"
