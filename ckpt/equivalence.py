"""Is a resharded checkpoint the same training state as its source?

Two checks, both under the target layout:
- the probe batch: loss and logits of the target-loaded model against SRC's consolidated
  weights (ckpt.weights), computed by the reshard worker (probe.json);
- the optimizer: the staged checkpoint is converted back to universal form and its fp32
  weights, Adam moments and step count compared with the source's universal form.
Loading moves whole fp32 tensors between partitions, so any difference at all means a
parameter was mapped wrongly; the logit tolerance only allows for a forward pass run by
a different process layout.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

from ckpt import universal

LOGIT_TOLERANCE = 1e-6
MOMENT_TOLERANCE = 0.0


def _max_abs_diffs(source: dict, target: dict, key: str) -> float:
    if set(source) != set(target):
        return float("inf")
    worst = 0.0
    for name, states in source.items():
        a, b = states.get(key), target[name].get(key)
        # ZeRO-3 conversion stores flat tensors: compare element order, not shape.
        if a is None or b is None or a.numel() != b.numel():
            return float("inf")
        worst = max(worst, float((a.reshape(-1) - b.reshape(-1)).abs().max()) if a.numel() else 0.0)
    return worst


def optimizer_check(source_folder: Path, staged: Path, work: Path, zero_stage: int) -> dict:
    folder = universal.to_universal(staged, work / "check" / staged.name, zero_stage, io.StringIO())
    source, target = universal.read_states(source_folder), universal.read_states(folder)
    result = {f"max_abs_diff_{key}": _max_abs_diffs(source, target, key)
              for key in universal.MOMENTS}
    result["max_abs_diff_fp32"] = _max_abs_diffs(source, target, "fp32")
    result["step_source"] = universal.universal_step(source_folder)
    result["step_target"] = universal.universal_step(folder)
    result["carried"] = (all(v <= MOMENT_TOLERANCE for k, v in result.items() if k.startswith("max_"))
                         and result["step_source"] == result["step_target"])
    return result


def check_equivalence(source_folder: Path, staged: Path, work: Path, cfg) -> dict:
    """The equivalence dict recorded in ReshardResult (and printed by the CLI)."""
    probe = json.loads((work / "probe.json").read_text())
    moments = optimizer_check(source_folder, staged, work, cfg.parallel.zero_stage)
    logits_ok = probe["max_abs_logit_diff"] <= LOGIT_TOLERANCE
    loss_ok = abs(probe["probe_loss_source"] - probe["probe_loss_target"]) <= LOGIT_TOLERANCE
    return {**probe, "tolerance": LOGIT_TOLERANCE, "moment_tolerance": MOMENT_TOLERANCE,
            "optimizer_moments": moments,
            "checks": {"logits": logits_ok, "probe_loss": loss_ok, "optimizer": moments["carried"]},
            "passed": logits_ok and loss_ok and moments["carried"]}
