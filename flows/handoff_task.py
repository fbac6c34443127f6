"""The handoff task at a stage boundary: select -> record -> reshard -> carry policy.

Wiring only: diagnostics live in `handoff.candidates`, the decisions in `handoff.decide`
and `handoff.carry`, resharding in `handoff.reshard`, records in `flows.recording`.
"""
from __future__ import annotations

from dataclasses import asdict

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from ckpt.errors import CheckpointError
from flows.stage_config import stage_config


@task(name="handoff", cache_policy=NO_CACHE)
def run_handoff(overrides: list[str], name: str, pipeline_run_id: int, from_stage_run_id: int,
                stage_root: str) -> dict:
    from ckpt import retention, signing
    from core.repro import pin_this_process
    from flows.recording import Recording
    from handoff import decide
    from handoff.candidates import evaluate_candidates, new_parameters
    from handoff.carry import carry_lines, carry_record
    from lineage import CandidateSpec
    from stages.model import ensure_model_dir

    cfg = stage_config(overrides, None, stage_root)
    pin_this_process(cfg.repro)  # candidates are evaluated in this process
    signing.configure(cfg.ckpt.signing_key_env)  # candidates are read (and resharded) here
    plan = cfg.pipeline.handoffs[name]
    target = stage_config(overrides, plan.to_stage, stage_root)
    rec = Recording(cfg)
    recorded = [c for c in rec.store.checkpoints(from_stage_run_id) if c.committed]
    by_path = {c.path: c for c in recorded}
    source_cfg = stage_config(overrides, plan.from_stage, stage_root)
    model_dir = str(ensure_model_dir(source_cfg))
    candidates = evaluate_candidates([(c.path, c.step) for c in recorded], plan.from_stage,
                                     model_dir, target, plan.selection, source_cfg)
    sel = plan.selection
    study = None
    if sel.criterion == "study":
        from flows.study_records import study_winner
        study = study_winner(rec.store)
    chosen, reason = decide.choose(candidates, sel, study)
    new_params = new_parameters(decide.loaded_as(plan), model_dir, chosen.path)
    handoff = rec.store.record_handoff(
        from_stage_run_id, plan.to_stage, sel.criterion, by_path[chosen.path].id, reason,
        [CandidateSpec(by_path[c.path].id, c.metrics, c.eligible, c.rejection, c.rank)
         for c in candidates],
        criterion_params={**asdict(sel), **({"study": asdict(study)} if study else {})},
        entropy=chosen.metrics["entropy"],
        carry_policy=carry_record(plan.carry, new_params, _train_data(target)))
    retention.pin(chosen.path, f"handoff {name} #{handoff.id} of pipeline run {pipeline_run_id}")  # for good
    print(f"[handoff {name}] #{handoff.id}: chose {plan.from_stage} step {chosen.step} by "
          f"{sel.criterion}: {reason}", flush=True)
    for line in carry_lines(plan.carry, plan.to_stage, new_params, _train_data(target)):
        print(f"[handoff {name}] {line}", flush=True)
    dst = decide.reshard_destination(stage_root, name, handoff.id, chosen.path)
    try:
        prepared = decide.prepare_input(chosen.path, dst, source_cfg, target)
    except CheckpointError as exc:  # not equivalent, unsupported, or a damaged source
        # The pipeline stops here; the record says why, on the handoff and as an event.
        rec.store.set_handoff_reshard(handoff.id, equivalence=decide.failure_equivalence(exc))
        rec.store.record_event(from_stage_run_id, "handoff", "failure", step=chosen.step,
                               detail={"handoff_id": handoff.id, "error": str(exc)})
        raise
    rec.store.set_handoff_reshard(handoff.id, reshard=prepared.reshard,
                                  equivalence=prepared.equivalence)
    if prepared.resharded:
        print(f"[handoff {name}] resharded {prepared.source.to_dict()} -> "
              f"{prepared.target.to_dict()}: {prepared.path} (equivalence passed="
              f"{prepared.equivalence.get('passed')})", flush=True)
    _artifacts(name, handoff.id, candidates, chosen, reason)
    return {"handoff_id": handoff.id, "role": plan.role, "input_path": prepared.path,
            "chosen_path": chosen.path, "to_stage": plan.to_stage, "carry": asdict(plan.carry)}


def _train_data(cfg) -> str | None:
    """The next stage's train data path (stages.data), None for the built-in tasks."""
    return getattr(cfg.data, cfg.stage.name).train.path


def _artifacts(name: str, handoff_id: int, candidates, chosen, reason: str) -> None:
    rows = [{"step": c.step, "chosen": c is chosen, "eligible": c.eligible, "rank": c.rank,
             **{k: round(v, 4) for k, v in c.metrics.items()}, "rejection": c.rejection or ""}
            for c in candidates]
    key = f"handoff-{name.replace('_', '-')}-{handoff_id}"
    create_table_artifact(rows, key=key, description=f"Candidates of handoff {name} #{handoff_id}")
    create_markdown_artifact(f"### Handoff {name} #{handoff_id}\nChose step **{chosen.step}**: {reason}",
                             key=key + "-why")
