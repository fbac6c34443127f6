"""`baton ckpt export`: a committed checkpoint's weights as a Hugging Face model directory.

The model is built the way its stage builds it (`OBJECTIVES[stage].build_model` on the
checkpoint's recorded model directory: a causal LM, or the reward model's
sequence-classification class), the weights come through `ckpt.weights` (the verified,
safe consolidation for any ZeRO stage), and every parameter must come from the
checkpoint: a missing or left-over one refuses the export. The directory is staged
beside DIR and renamed into place once complete.

A checkpoint saved mid-accumulation exports too: its weights are those after its last
optimizer step (the partial gradients are not weights), which the model card says.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from core.errors import BatonError
from ckpt import manifest as manifest_io
from ckpt.commit import fresh_staging
from ckpt.content_digest import content_digest
from ckpt.compat import read_meta

CARD, PROVENANCE = "README.md", "baton_export.json"
STAGING_SUFFIX = ".exporting"


class ExportError(BatonError):
    def __init__(self, path, message: str):
        self.path = str(path)
        super().__init__(f"{self.path}: {message}")


@dataclass
class ExportResult:
    directory: Path
    stage: str
    step: int
    model_class: str
    provenance: dict


def _model_dir(src: Path, meta: dict) -> Path:
    recorded = meta.get("model_dir")
    if not recorded or not (Path(recorded) / "config.json").is_file():
        raise ExportError(src, (
            f"meta.json names model directory {recorded!r}, which has no config.json any more; "
            "the export takes the model config and tokenizer from it. Restore that directory "
            "(for the built-in model: <run.dir>/model, recreated by running any stage there)"))
    return Path(recorded)


def _fresh_target(out: Path) -> Path:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(out, "already exists and is not empty; pick a new directory (an "
                          "export is written whole or not at all)")
    return fresh_staging(out, STAGING_SUFFIX, lambda why: ExportError(
        out, f"cannot create it ({why}); pick a directory you can write to"))


def load_checkpoint_model(src: Path, manifest, meta: dict):
    """(model, tokenizer) of the stage that saved `src`, holding exactly its weights."""
    from ckpt.weights import load_weights_into
    from stages.registry import OBJECTIVES

    objective = OBJECTIVES.get(manifest.stage)
    if objective is None:
        raise ExportError(src, f"stage {manifest.stage!r} in its manifest is none of "
                          f"{', '.join(OBJECTIVES)}; cannot tell which model class it trains")
    model, tokenizer = objective.build_model(_model_dir(src, meta))
    template = ((meta.get("config") or {}).get("model") or {}).get("chat_template")
    if template:  # the stage rendered its chat data with model.chat_template: ship that one
        from stages.data.prepare import template_text
        tokenizer.chat_template = template_text(template)
    report = load_weights_into(model, src, allow_new_head=False)
    if report["dropped"]:
        raise ExportError(src, f"parameters {report['dropped'][:5]} of the checkpoint have no "
                          f"place in {type(model).__name__}; exporting would lose them")
    return model, tokenizer


def _handoff_text(p: dict) -> str:
    handoff, init_from = p.get("handoff"), (p.get("parent") or {}).get("init_from")
    if handoff:
        return (f"{handoff['id']}: {handoff['from_stage']} → {handoff['to_stage']}, criterion "
                f"`{handoff['criterion']}`, chosen step {handoff['chosen_step']}")
    if init_from:
        return f"none recorded; the stage started from `stage.init_from={init_from}`"
    return "none (a first stage)"


def model_card(p: dict) -> str:
    """README.md: where the weights come from, in words and as a table."""
    rows = [("checkpoint", f"`{p['checkpoint']}`"), ("stage", p["stage"]), ("step", p["step"]),
            ("model class", p["model_class"]), ("content digest", f"`{p.get('content_digest')}`"),
            ("manifest sha256", f"`{p['manifest_sha256']}`")]
    if p.get("pipeline_run"):
        run = p["pipeline_run"]
        rows.insert(0, ("pipeline run", f"#{run['id']} {run['name']!r} ({run['status']})"))
    if p.get("stage_run"):
        rows.append(("stage run", f"{p['stage_run']['id']} (attempt {p['stage_run']['attempt']})"))
    rows.append(("handoff", _handoff_text(p)))
    rows += [("handed on by", f"handoff {h['id']} to {h['to_stage']}") for h in p.get("handed_on", [])]
    if p.get("adopted"):
        rows.append(("adopted from", f"`{p['adopted']['source']}` ({p['adopted']['kind']})"))
    if p.get("mid_accumulation"):
        rows.append(("saved", "mid-accumulation: these are the weights after step "
                     f"{p['step']} (the partial gradients of the next step are not included)"))
    rows += [("config hash", f"`{p.get('config_hash')}`"), ("parent", f"`{json.dumps(p.get('parent'))}`")]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    return ("---\nlibrary_name: transformers\ntags:\n- baton\n---\n\n"
            f"# {p['stage'].upper()} step {p['step']}\n\n"
            f"Weights of the baton checkpoint `{p['checkpoint']}`: stage **{p['stage']}**, step "
            f"**{p['step']}**, exported with `baton ckpt export`. Load with "
            f"`{p['auto_class']}.from_pretrained(<this directory>)`.\n\n"
            f"| | |\n|---|---|\n{table}\n")


def export(checkpoint: str | Path, out: str | Path, lineage_facts: dict | None = None) -> ExportResult:
    """Write `checkpoint`'s weights, config, tokenizer and model card to `out`."""
    src, out = Path(checkpoint).resolve(), Path(out).resolve()
    manifest = manifest_io.verify(src, checksums=False)  # load_weights_into checks every byte
    meta = read_meta(src, manifest)
    staging = _fresh_target(out)
    try:
        model, tokenizer = load_checkpoint_model(src, manifest, meta)
        auto = ("AutoModelForSequenceClassification"
                if type(model).__name__.endswith("ForSequenceClassification") else "AutoModelForCausalLM")
        provenance = {"checkpoint": str(src), "stage": manifest.stage, "step": manifest.step,
                      "mid_accumulation": manifest.mid_accumulation,
                      "manifest_sha256": manifest_io.checksum_of(src / manifest_io.MANIFEST),
                      "content_digest": content_digest(manifest),
                      "model_class": type(model).__name__, "auto_class": auto,
                      "config_hash": meta.get("config_hash"), "parent": meta.get("parent"),
                      "adopted": manifest.adopted, **(lineage_facts or {})}
        model.save_pretrained(str(staging), safe_serialization=True)
        tokenizer.save_pretrained(str(staging))
        (staging / CARD).write_text(model_card(provenance))
        (staging / PROVENANCE).write_text(json.dumps(provenance, indent=1, sort_keys=True))
        if out.exists():
            out.rmdir()  # empty, checked above
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ExportResult(out, manifest.stage, manifest.step, type(model).__name__, provenance)
