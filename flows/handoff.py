"""The handoff task at a stage boundary: select -> record -> reshard -> carry policy.

Wiring only: diagnostics live in `stages.candidates`, criteria in `ckpt.selection`,
resharding in `ckpt.reshard`, records in `flows.recording`.
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from ckpt.errors import CheckpointError
from flows.stage_config import stage_config


def carry_lines(carry, target_stage: str, new_parameters: list[str]) -> list[str]:
    """Each setting inherited or reset, said out loud (nanochat's 'Inherited lr=…')."""
    lines = []
    for key, label in (("weights", "weights"), ("optimizer", "optimizer moments"),
                       ("scheduler", "LR scheduler position"), ("rng", "RNG streams")):
        if getattr(carry, key):
            lines.append(f"{target_stage}: inherited {label} from the chosen checkpoint "
                         f"(carry.{key}=true)")
        else:
            lines.append(f"{target_stage}: {label} reset (carry.{key}=false)"
                         + (", derived from (seed, stage, rank)" if key == "rng" else ""))
    lines += [f"{target_stage}: new parameter {name} (not in the checkpoint)" for name in new_parameters]
    return lines


@task(name="handoff", cache_policy=NO_CACHE)
def run_handoff(overrides: list[str], name: str, pipeline_run_id: int, from_stage_run_id: int,
                stage_root: str) -> dict:
    from flows.recording import Recording
    from lineage import CandidateSpec
    from ckpt.selection import select
    from stages.candidates import evaluate_candidates, new_parameters
    from stages.model import ensure_model_dir

    cfg = stage_config(overrides, None, stage_root)
    from ckpt import signing
    signing.configure(cfg.ckpt.signing_key_env)  # candidates are read (and resharded) here
    plan = cfg.pipeline.handoffs[name]
    target = stage_config(overrides, plan.to_stage, stage_root)
    rec = Recording(cfg)
    recorded = [c for c in rec.store.checkpoints(from_stage_run_id) if c.committed]
    by_path = {c.path: c for c in recorded}
    source_cfg = stage_config(overrides, plan.from_stage, stage_root)
    model_dir = str(ensure_model_dir(source_cfg))
    candidates = evaluate_candidates([(c.path, c.step) for c in recorded], plan.from_stage,
                                     model_dir, target, plan.selection)
    sel = plan.selection
    chosen, reason = select(candidates, sel.criterion, score_metric=sel.score_metric,
                            entropy_floor=sel.entropy_floor, score_tolerance=sel.score_tolerance)
    # A policy becomes the next stage's model; a reward model is loaded downstream as itself.
    loaded_as = plan.to_stage if plan.role == "policy" else plan.from_stage
    new_params = new_parameters(loaded_as, model_dir, chosen.path)
    carry = {**asdict(plan.carry), "new_parameters": new_params,
             "reset": [k for k, v in asdict(plan.carry).items() if not v]}
    handoff = rec.store.record_handoff(
        from_stage_run_id, plan.to_stage, sel.criterion, by_path[chosen.path].id, reason,
        [CandidateSpec(by_path[c.path].id, c.metrics, c.eligible, c.rejection, c.rank)
         for c in candidates],
        criterion_params=asdict(sel), entropy=chosen.metrics["entropy"], carry_policy=carry)
    print(f"[handoff {name}] #{handoff.id}: chose {plan.from_stage} step {chosen.step} by "
          f"{sel.criterion}: {reason}", flush=True)
    for line in carry_lines(plan.carry, plan.to_stage, new_params):
        print(f"[handoff {name}] {line}", flush=True)
    try:
        input_path = _reshard(rec, handoff.id, name, chosen.path, source_cfg, target, stage_root)
    except CheckpointError as exc:  # not equivalent, unsupported, or a damaged source
        # The pipeline stops here; the record says why, on the handoff and as an event.
        details = getattr(exc, "details", {})
        rec.store.set_handoff_reshard(handoff.id, equivalence={**details, "passed": False,
                                                               "error": str(exc)})
        rec.store.record_event(from_stage_run_id, "handoff", "failure", step=chosen.step,
                               detail={"handoff_id": handoff.id, "error": str(exc)})
        raise
    _artifacts(name, handoff.id, candidates, chosen, reason)
    return {"handoff_id": handoff.id, "role": plan.role, "input_path": input_path,
            "chosen_path": chosen.path, "to_stage": plan.to_stage, "carry": asdict(plan.carry)}


def _reshard(rec, handoff_id: int, name: str, chosen_path: str, source_cfg, target, stage_root) -> str:
    """Convert to the next stage's layout through a universal checkpoint, verify, record."""
    from ckpt import manifest as manifest_io

    src, dst = Path(chosen_path), Path(stage_root) / "handoffs" / f"{name}-{handoff_id}" / Path(chosen_path).name
    source_layout = {k: getattr(source_cfg.parallel, k) for k in ("world_size", "zero_stage")}
    target_layout = {k: getattr(target.parallel, k) for k in ("world_size", "zero_stage")}
    if source_layout == target_layout:
        checksum = manifest_io.checksum_of(src / manifest_io.MANIFEST)
        rec.store.set_handoff_reshard(handoff_id, reshard={
            "source": str(src), "source_parallel": source_layout, "target_parallel": target_layout,
            "converter": "none (same layout)",
            "input_manifest_sha256": checksum, "output_manifest_sha256": checksum, "output": str(src)},
            equivalence={"passed": True, "detail": "identical layout: the checkpoint is used as is"})
        return str(src)
    from ckpt.reshard import reshard

    result = reshard(src, dst, [f"parallel.world_size={target_layout['world_size']}",
                                f"parallel.zero_stage={target_layout['zero_stage']}"])
    transform = {k: v for k, v in result.to_dict().items() if k != "equivalence"}
    rec.store.set_handoff_reshard(handoff_id, reshard={
        **transform, "output": str(dst)},
        equivalence=dict(result.equivalence))
    print(f"[handoff {name}] resharded {source_layout} -> {target_layout}: {dst} "
          f"(equivalence passed={result.equivalence.get('passed')})", flush=True)
    return str(dst)


def _artifacts(name: str, handoff_id: int, candidates, chosen, reason: str) -> None:
    rows = [{"step": c.step, "chosen": c is chosen, "eligible": c.eligible, "rank": c.rank,
             **{k: round(v, 4) for k, v in c.metrics.items()}, "rejection": c.rejection or ""}
            for c in candidates]
    key = f"handoff-{name.replace('_', '-')}-{handoff_id}"
    create_table_artifact(rows, key=key, description=f"Candidates of handoff {name} #{handoff_id}")
    create_markdown_artifact(f"### Handoff {name} #{handoff_id}\nChose step **{chosen.step}**: {reason}",
                             key=key + "-why")
