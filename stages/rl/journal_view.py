"""What `baton rl journal show` prints: a line per step, a row per sample, or one sample
in full (tokens, the engine's and the trainer's log-probs side by side). Every segment
shown is checksum-verified first (ckpt.journal.read_segment)."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from ckpt import journal
from core.errors import BatonError


class NoJournal(BatonError):
    def __init__(self, run: Path, root: Path):
        super().__init__(f"{run}: no RL journal at {root}; expected the run directory of an RL "
                         "stage (run.dir), whose rl/journal/ holds one segment per step")


def journal_of(run: Path) -> Path:
    from stages.rl.steps import journal_root
    root = journal_root(run)
    if not root.is_dir():
        raise NoJournal(run, root)
    return root


def step_summary(records: dict, tensors: dict) -> dict:
    kinds = Counter(e["kind"] for e in records["events"])
    samples = records["samples"]
    scored = [s for s in samples if s["reward"] is not None]  # not the dropped groups'
    return {"step": records["step"], "prompts": len(records["prompts"]), "samples": len(samples),
            "policy_version": samples[0]["policy_version"] if samples else None,
            "kl_coef": records["kl_coef"],
            "reward": sum(s["reward"]["total"] for s in scored) / max(len(scored), 1),
            "kl": sum(s["kl"] for s in scored) / max(len(scored), 1),
            "env_failures": kinds.get("env_failure", 0), "dropped": kinds.get("drop", 0),
            "env_alerts": kinds.get("env_alert", 0),
            "weight_syncs": kinds.get("weight_sync", 0),
            "role_failures": kinds.get("role_failure", 0), "retries": kinds.get("retry", 0),
            "trainer_restarts": kinds.get("trainer_restart", 0), "events": records["events"],
            "mismatch": records.get("mismatch"), "staleness": records.get("staleness")}


def sample_detail(records: dict, tensors: dict, index: int) -> dict:
    if not 0 <= index < len(records["samples"]):
        raise BatonError(f"--sample {index}: step {records['step']} has samples 0.."
                         f"{len(records['samples']) - 1}; pick one of them")
    row = dict(records["samples"][index])
    prompt = next(p for p in records["prompts"] if p["prompt_index"] == row["prompt_index"])
    row["prompt_ids"] = prompt["prompt_ids"]
    for key in ("tokens", "mask", "rollout_logp", "trainer_logp"):
        row[key] = tensors[key][index].tolist()
    return row


def recoveries(summaries: list[dict]) -> dict:
    """The time each failure cost. A role's: from a request's failure to its re-issued
    answer, the longest over the requests that role lost in that step (`recovered` events).
    The trainer's: from its death to its first new step (`trainer_restart`). And the ratio
    of their medians when both happened in the run."""
    lost: dict[tuple[int, str], float] = {}
    for s in summaries:
        for e in s["events"]:
            if e["kind"] == "recovered":
                key = (s["step"], e["role"])
                lost[key] = max(lost.get(key, 0.0), e["seconds"])
    roles = [{"step": step, "role": role, "seconds": seconds} for (step, role), seconds in lost.items()]
    trainer = [{"step": s["step"], "seconds": e["seconds"], "caught_up": e["caught_up"]}
               for s in summaries for e in s["events"]
               if e["kind"] == "trainer_restart" and e.get("seconds") is not None]
    ratio = None
    if roles and trainer:
        ratio = _median([r["seconds"] for r in roles]) / _median([t["seconds"] for t in trainer])
    return {"roles": roles, "trainer": trainer, "role_over_trainer": ratio}


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def run_ettr(run: Path) -> float | None:
    """ETTR of the run (stages.rl.env_records.ettr) from its rl/metrics.jsonl."""
    import json

    from stages.rl.env_records import ettr

    metrics = Path(run) / "rl" / "metrics.jsonl"
    if not metrics.is_file():
        return None
    return ettr([json.loads(line) for line in metrics.read_text().splitlines() if line.strip()])


def show(run: Path, step: int | None, sample: int | None) -> dict:
    root = journal_of(run)
    steps = journal.committed_steps(root)
    if step is None:
        summaries = [step_summary(*journal.read_segment(root, s)) for s in steps]
        return {"journal": str(root), "steps": summaries, "recovery": recoveries(summaries),
                "ettr": run_ettr(run)}
    if step not in steps:
        raise BatonError(f"--step {step}: {root} has no such segment (committed steps: "
                         f"{steps[0] if steps else '-'}..{steps[-1] if steps else '-'}); pick one of them")
    records, tensors = journal.read_segment(root, step)
    if sample is None:
        return {"journal": str(root), **step_summary(records, tensors), "rows": records["samples"]}
    return {"journal": str(root), "step": step, "sample": sample_detail(records, tensors, sample)}
