"""`baton ckpt adopt PATH` and `baton ckpt export CHECKPOINT DIR`: checkpoints into and out of baton.

adopt: a foreign DeepSpeed checkpoint or Hugging Face model directory becomes a
weights-only baton checkpoint under `<run.dir>/adopted/<name>/`, checked against the
model it is for and recorded in lineage. export: a committed checkpoint's weights as
a Hugging Face model directory, optionally registered in MLflow.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

# Stages whose checkpoints another stage starts from (stage.init_from: cpt, sft) or
# uses (stage.reward_model_from: rm); an RL checkpoint is an end product.
STAGES = ("cpt", "sft", "rm")
ADOPTED_DIR = "adopted"
NEXT_STAGE = {"cpt": "sft", "sft": "rl"}
NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*$")


def add_arguments(sub) -> None:
    adopt = sub.add_parser("adopt", help="bring a DeepSpeed checkpoint or Hugging Face model "
                           "directory in as a weights-only checkpoint usable as stage.init_from")
    adopt.add_argument("path", help="DeepSpeed tag directory or root, or HF model directory")
    adopt.add_argument("--stage", choices=STAGES, default="cpt",
                       help="stage whose output the checkpoint stands for (default cpt: a "
                       "pretrained model that SFT starts from)")
    adopt.add_argument("--name", help="directory name under <run.dir>/adopted/ (default: "
                       "derived from PATH)")
    export = sub.add_parser("export", help="write a checkpoint's weights as a Hugging Face "
                            "model directory (safetensors, config, tokenizer, model card)")
    export.add_argument("checkpoint", help="committed checkpoint directory")
    export.add_argument("dir", help="new (or empty) output directory")
    export.add_argument("--register", metavar="NAME",
                        help="also register DIR as a version of MLflow registered model NAME, "
                        "linked to the stage run that trained it")


def _given(argument: str, value: str, expected: str) -> Path:
    """A path argument; an empty one is refused rather than read as the current directory."""
    from core.errors import UsageError

    if not value.strip():
        raise UsageError(argument, value, f"an empty path; expected {expected}")
    return Path(value)


def _adopted_name(name: str | None, found) -> str:
    """--name, or one made of the source's directory names; one plain path component."""
    from core.errors import UsageError

    if name is not None:
        if not NAME.match(name):
            raise UsageError("--name", name, "a plain directory name (letters, digits, '.', "
                             "'_', '-'; not starting with '.')")
        return name
    base = found.root or found.directory
    parts = [base.name] + ([found.directory.name] if found.root is not None else [])
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", "-".join(parts)).strip(".-") or "checkpoint"


def _fit_check(stage: str, model_dir: Path):
    """The adopted weights must load, safely, into the model `stage` builds from `model_dir`."""
    def check(staged: Path) -> None:
        from ckpt.weights import load_weights_into
        from stages.registry import objective_class

        objective = objective_class(stage)
        model, _ = objective.build_model(model_dir)
        load_weights_into(model, staged, allow_new_head=objective.new_head)
    return check


def adopt(args) -> int:
    from core.config import compose
    from ckpt.adopt import adopt as adopt_checkpoint, find_source
    from ckpt.foreign import HF
    from stages.model import ensure_model_dir, model_identity_from_dir
    from stages.registry import objective_class
    from core.fingerprint import library_versions

    cfg = compose(args.overrides)
    found = find_source(_given("PATH", args.path, "a DeepSpeed checkpoint or Hugging Face "
                               "model directory"))
    # A HF directory is its own model; DeepSpeed files are checked against the configured one.
    model_dir = found.directory if found.kind == HF else ensure_model_dir(cfg)
    destination = Path(cfg.run.dir) / ADOPTED_DIR / _adopted_name(args.name, found)
    meta = {"model": model_identity_from_dir(model_dir, objective_class(args.stage).model_class), "model_dir": str(model_dir),
            "run_dir": cfg.run.dir, "versions": library_versions()}
    manifest = adopt_checkpoint(found.root or found.directory, destination, args.stage, meta,
                                check=_fit_check(args.stage, model_dir))
    checkpoint = _record(cfg, destination, manifest, found.kind)
    print(f"[baton] adopted {manifest.adopted['source']} ({found.kind}) as {destination}: "
          f"{args.stage} step {manifest.step}, {len(manifest.files)} files; absent: "
          f"{', '.join(manifest.adopted['absent'])}; lineage checkpoint {checkpoint.id}")
    print("[baton] next: " + _next_command(cfg, args.stage, destination, found, model_dir))
    return 0


def _next_command(cfg, stage: str, destination: Path, found, model_dir: Path) -> str:
    """The command that uses the adopted checkpoint: a policy starts the next stage, a
    reward model scores RL rollouts."""
    from ckpt.foreign import HF

    if stage == "rm":
        words = ["baton", "stage", "rl", "stage.init_from=<policy checkpoint>",
                 f"stage.reward_model_from={destination}", "stage.reward_model_weight=1.0"]
    else:
        words = ["baton", "stage", NEXT_STAGE[stage], f"stage.init_from={destination}"]
    if found.kind == HF or cfg.model.path:
        words.append(f"model.path={model_dir}")
    return " ".join(words + [f"run.dir={cfg.run.dir}"])


def _record(cfg, destination: Path, manifest, kind: str):
    from ckpt import manifest as manifest_io
    from core.fingerprint import code_version
    from lineage.provenance import record_adoption
    from lineage.store import LineageStore
    from lineage.urls import store_url

    with LineageStore.open(store_url(cfg)) as store:
        return record_adoption(
            store, stage=manifest.stage, path=str(destination), step=manifest.step, kind=kind,
            manifest_checksum=manifest_io.checksum_of(destination / manifest_io.MANIFEST),
            size=manifest.total_bytes(), parallel=manifest.parallel, origin=manifest.adopted,
            code_version=code_version())


def _export_config(overrides: list[str], src: Path):
    """The run whose lineage and MLflow describe `src`: the overrides if given, else the
    config its meta.json recorded (store.url and mlflow.tracking_uri are pinned there)."""
    from core.config import compose
    from core.config.compose import from_dict
    from ckpt import manifest as manifest_io
    from ckpt.compat import read_meta

    if overrides:
        return compose(overrides)
    meta = read_meta(src, manifest_io.verify(src, checksums=False))
    if meta.get("config"):
        return from_dict(meta["config"])
    return compose([f"run.dir={meta['run_dir']}"] if meta.get("run_dir") else [])


def _lineage_facts(cfg, src: Path) -> tuple[dict, str]:
    """What the lineage store knows of `src` ({} if nothing) and a line saying so."""
    from lineage.errors import LineageError
    from lineage.provenance import checkpoint_facts
    from lineage.store import LineageStore
    from lineage.urls import safe_url, store_url

    url = safe_url(store_url(cfg))
    try:
        with LineageStore.open(store_url(cfg), create=False) as store:
            facts = checkpoint_facts(store, str(src))
    except LineageError as exc:
        return {}, f"lineage store not read ({exc})"
    if facts is None:
        return {}, f"not recorded in the lineage store {url}"
    return facts, (f"lineage: pipeline run #{facts['pipeline_run']['id']}, stage run "
                   f"{facts['stage_run']['id']}")


def export(args) -> int:
    from stages.export import export as export_checkpoint

    from ckpt.named import named_checkpoint

    src = named_checkpoint(args.checkpoint, "CHECKPOINT").resolve()
    out = _given("DIR", args.dir, "a new or empty directory for the Hugging Face model")
    cfg = _export_config(args.overrides, src)
    facts, note = _lineage_facts(cfg, src)
    result = export_checkpoint(src, out, facts)
    print(f"[baton] exported {result.stage} step {result.step} ({result.model_class}) from {src} "
          f"to {result.directory}; {note}")
    if args.register:
        _register(cfg, args.register, result, facts)
    return 0


def _register(cfg, name: str, result, facts: dict) -> None:
    from core.errors import BatonError
    from lineage.mlflow_bridge import mlflow_lineage
    from lineage.mlflow_export import register_export

    if not cfg.mlflow.enabled:
        raise BatonError(f"--register {name}: mlflow.enabled=false for this run; pass "
                         "mlflow.enabled=true (and mlflow.tracking_uri=... if not the default)")
    run_id = (facts.get("stage_run") or {}).get("mlflow_run_id")
    tags = {"baton.checkpoint.path": result.provenance["checkpoint"], "baton.stage": result.stage,
            "baton.step": result.step, "baton.model_class": result.model_class}
    if facts:
        tags.update({"baton.pipeline_run.id": facts["pipeline_run"]["id"],
                     "baton.stage_run.id": facts["stage_run"]["id"]})
    version = register_export(mlflow_lineage(cfg), name, result.directory, run_id, tags)
    link = f"linked to MLflow run {run_id}" if run_id else (
        "not linked to a run: the lineage store has no MLflow run for this checkpoint")
    print(f"[baton] registered {name} version {version.version} ({link})", file=sys.stdout)


def main(args) -> int:
    return {"adopt": adopt, "export": export}[args.action](args)
