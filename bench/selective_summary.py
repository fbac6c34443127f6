"""The selective bench's numbers from what its stages left: bytes per save and in total,
which checkpoint the restart is taken from, and the loss deviation after it."""
from __future__ import annotations

import statistics


def bytes_summary(saves: list[dict]) -> dict:
    """What one run wrote, save by save (`saves` from StageRun.saves)."""
    per_save = [save["bytes"] for save in saves]
    return {"steps": [save["step"] for save in saves], "bytes_per_save": per_save,
            "total_bytes": sum(per_save), "saves": saves,
            "composite_saves": sum(1 for save in saves if save["references"])}


def restart_point(saves: list[dict], middle: int) -> dict:
    """The last save at or before `middle` that references an earlier checkpoint's layer
    file (a composite state: the case selective persistence changes); the last save at
    or before it if none does (then `composite` says so)."""
    before = [save for save in saves if save["step"] <= middle]
    assert before, f"no save at or before step {middle}"  # selective_options checks this
    composite = [save for save in before if save["references"]]
    chosen = (composite or before)[-1]
    return {"step": chosen["step"], "checkpoint": chosen["checkpoint"],
            "composite": bool(chosen["references"]), "references": chosen["references"]}


def deviation(reference: dict[int, float], restarted: dict[int, float], steps: list[int]) -> dict:
    """|l_restart - l_ref| / l_ref at each step of `steps` (both runs saw the same batches:
    the sampler's position is part of the checkpoint)."""
    missing = [step for step in steps if step not in reference or step not in restarted]
    if missing:
        raise RuntimeError(f"bench ckpt --selective: no training loss logged for steps "
                           f"{missing[:5]} in both runs; metrics.jsonl is incomplete")
    per_step = [abs(restarted[step] - reference[step]) / reference[step] for step in steps]
    mean_reference = statistics.fmean(reference[step] for step in steps)
    mean_restart = statistics.fmean(restarted[step] for step in steps)
    return {"steps": steps, "loss_reference": [reference[step] for step in steps],
            "loss_restart": [restarted[step] for step in steps], "per_step": per_step,
            "deviation_max": max(per_step), "deviation_mean": statistics.fmean(per_step),
            # The window's mean loss: per-step losses of 16-sample batches also carry the
            # batch's own noise, which a perturbed trajectory samples differently.
            "mean_loss_deviation": abs(mean_restart - mean_reference) / mean_reference}
