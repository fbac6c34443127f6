"""Check and tokenize a stage's own data before any worker starts; cache it by content.

The result is a plan (a JSON-able dict) that goes into launch.json: for the train and
the eval split, where its tokenized Arrow copy lies and what it is (path, content
digest, rows, format, key mapping, tokenizer and chat-template digests). The workers
memory-map those copies (stages.data.examples); lineage and MLflow record the plan.

The cache key covers everything the tokens depend on: the data's content digest, the
tokenizer's files, the chat template, the format and key mapping, max_length,
truncation, loss_on and, for a held-out fraction, the seed. A second run on the same
data reads the cache and does not tokenize again.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path

from core.errors import ConfigError
from stages.data.files import DataFiles, content_digest, load, no_rows, resolve
from stages.data.formats import ALL_ROLES, MESSAGES, OPTIONAL_ROLES, ROLES, STAGE_FORMATS, column_of, stage_format
from stages.data.render import Renderer, RowProblem

PLAN = "plan.json"
RENDER_VERSION = 2
"""Bumped when render.py would give other tokens for the same inputs (part of the key)."""
OUTPUT_COLUMNS = {"text": ("input_ids", "labels"), "prompt_completion": ("input_ids", "labels"),
                  "messages": ("input_ids", "labels"), "preference": ("chosen_ids", "rejected_ids"),
                  "prompts": ("prompt_ids", "answer_json", "extra_json")}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json")
# Fewer rows than this are tokenized in this process: starting workers costs more.
PARALLEL_FROM_ROWS = 20_000


def data_section(cfg, stage: str):
    return getattr(cfg.data, stage)


def uses_own_data(cfg, stage: str) -> bool:
    return bool(data_section(cfg, stage).train.path)


def prepare_data(cfg, model_dir: Path) -> dict | None:
    """The stage's data plan, tokenizing (or reading the cache) first; None when the stage
    trains on the built-in tasks. Every problem is a ConfigError naming file, row and key."""
    stage = cfg.stage.name
    if not uses_own_data(cfg, stage):
        return None
    section = data_section(cfg, stage)
    fmt = stage_format(stage, section.train.format)
    _check_options(cfg, stage, fmt)
    tokenizer, template = load_tokenizer(cfg, model_dir)
    max_length = cfg.data.max_length or cfg.stage.seq_len
    train = resolve(f"data.{stage}.train.path", section.train.path)
    held = resolve(f"data.{stage}.eval.path", section.eval.path) if section.eval.path else None
    columns = {role: column_of(section.train.keys, role) for role in ALL_ROLES}
    eval_columns = {role: getattr(section.eval.keys, role) or column_of(section.train.keys, role)
                    for role in ALL_ROLES}
    common = {"stage": stage, "format": fmt, "max_length": max_length,
              "truncation": cfg.data.truncation, "loss_on": cfg.data.loss_on,
              "tokenizer": tokenizer_digest(model_dir),
              "chat_template": _digest(template if isinstance(template, str)
                                       else json.dumps(template, sort_keys=True)) if template else None,
              "render_version": RENDER_VERSION}
    cache_root = Path(cfg.data.cache_dir or Path(cfg.run.dir) / "data_cache")
    cache_root.mkdir(parents=True, exist_ok=True)
    memo = cache_root / "digests.json"  # unchanged files are not read again (files.content_digest)
    sources = {"train": {**_describe(train, memo), "keys": _used(columns, fmt)}}
    if held is not None:
        sources["eval"] = {**_describe(held, memo), "keys": _used(eval_columns, fmt)}
    else:
        sources["eval"] = {"from": "train", "fraction": section.eval_fraction, "seed": cfg.seed}
    key = hashlib.sha256(json.dumps({**common, "sources": sources}, sort_keys=True).encode()).hexdigest()[:24]
    root = cache_root / key
    with open(root.parent / f"{key}.lock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # a second launch on the same data waits
        if not (root / PLAN).is_file():
            renderer = Renderer(tokenizer, fmt, columns, max_length, cfg.data.truncation, cfg.data.loss_on)
            eval_renderer = Renderer(tokenizer, fmt, eval_columns, max_length, cfg.data.truncation,
                                     cfg.data.loss_on)
            _build(root, stage, fmt, train, held, renderer, eval_renderer, sources, common,
                   section.eval_fraction, cfg.seed)
    plan = json.loads((root / PLAN).read_text())
    for split in ("train", "eval"):
        plan[split]["cache"] = str(root / split)
    if stage == "rl":
        from stages.data.rewards import check_rl_reward
        check_rl_reward(cfg, plan)
    return plan


def _check_options(cfg, stage: str, fmt: str) -> None:
    found = []
    if fmt not in STAGE_FORMATS[stage]:
        found.append(f"data.{stage}.train.format={fmt!r}: stage {stage} trains on "
                     f"{' or '.join(STAGE_FORMATS[stage])}")
    if cfg.data.truncation not in ("error", "left", "right"):
        found.append(f"data.truncation={cfg.data.truncation!r}: expected error, left or right")
    if cfg.data.loss_on not in ("completion", "all"):
        found.append(f"data.loss_on={cfg.data.loss_on!r}: expected completion or all")
    section = data_section(cfg, stage)
    if stage == "rl" and cfg.rl.env.task != "answer":
        found.append(f"rl.env.task={cfg.rl.env.task!r} with data.rl.train.path: the program "
                     "environment checks the built-in tasks' answers; score your prompts with "
                     "rl.reward.functions (rl.env.task=answer)")
    if not section.eval.path and not 0 < section.eval_fraction < 1:
        found.append(f"data.{stage}.eval_fraction={section.eval_fraction}: expected a share "
                     f"between 0 and 1 of the train rows, or data.{stage}.eval.path=<file>")
    if found:
        raise ConfigError(found)


def load_tokenizer(cfg, model_dir: Path):
    """The model's fast tokenizer with model.chat_template applied (a file or inline)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    if not tokenizer.is_fast:
        raise ConfigError([f"model.path={str(model_dir)!r}: its tokenizer loads as the slow "
                           f"{type(tokenizer).__name__}, which cannot say where each token starts "
                           "(needed to find the answer's tokens); save a fast tokenizer "
                           "(tokenizer.json) into the model directory"])
    if cfg.model.chat_template:
        tokenizer.chat_template = template_text(cfg.model.chat_template)
    return tokenizer, tokenizer.chat_template


def template_text(setting: str) -> str:
    """model.chat_template: a file's text, else the setting itself (an inline template)."""
    path = Path(setting)
    return path.read_text(encoding="utf-8") if path.is_file() else setting


def tokenizer_digest(model_dir: Path) -> str:
    from importlib.metadata import version

    hasher = hashlib.sha256(f"transformers=={version('transformers')} "
                            f"tokenizers=={version('tokenizers')}\n".encode())
    for name in TOKENIZER_FILES:
        path = Path(model_dir) / name
        if path.is_file():
            hasher.update(name.encode() + b"\n" + path.read_bytes())
    return "sha256:" + hasher.hexdigest()


def _describe(data: DataFiles, memo: Path) -> dict:
    return {"path": data.path, "kind": data.kind, "files": len(data.files),
            "digest": content_digest(data, memo)}


def _used(columns: dict, fmt: str) -> dict:
    return {role: columns[role] for role in ROLES[fmt]}


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _build(root: Path, stage: str, fmt: str, train: DataFiles, held: DataFiles | None,
           renderer: Renderer, eval_renderer: Renderer, sources: dict, common: dict,
           fraction: float, seed: int) -> None:
    """Tokenize into root.tmp, then rename: a half-built cache is never read."""
    import numpy as np

    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    hf_cache = root.parent / "hf"
    rows = _tokenized(train, fmt, renderer, hf_cache, hf_cache / f"{root.name}-train.arrow")
    if held is not None:
        held_rows, train_rows = _tokenized(held, fmt, eval_renderer, hf_cache, hf_cache / f"{root.name}-eval.arrow"), rows
    else:
        n_eval = int(len(rows) * fraction)
        if n_eval < 1:
            raise ConfigError([f"data.{stage}.eval_fraction={fraction} of {len(rows)} rows of "
                               f"{train.path} holds out no row; raise eval_fraction, or give a "
                               f"held-out file as data.{stage}.eval.path"])
        order = np.random.default_rng([seed, 0xE7A1]).permutation(len(rows))
        held_rows = rows.select(sorted(order[:n_eval].tolist()))
        train_rows = rows.select(sorted(order[n_eval:].tolist()))
    plan = {**common, "train": {**sources["train"], "rows": len(train_rows)},
            "eval": {**sources["eval"], "rows": len(held_rows)}}
    train_rows.save_to_disk(str(tmp / "train"))
    held_rows.save_to_disk(str(tmp / "eval"))
    (tmp / PLAN).write_text(json.dumps(plan, indent=1))
    tmp.rename(root)


def _tokenized(data: DataFiles, fmt: str, renderer: Renderer, hf_cache: Path, written: Path):
    """The rows tokenized (columns OUTPUT_COLUMNS[fmt] + length); refuses the first bad row.
    `written`: where `datasets.map` writes them (never beside your files)."""
    rows = load(data, hf_cache)
    if len(rows) == 0:
        raise no_rows(data)
    _check_columns(data, fmt, rows.column_names, renderer)
    if fmt == MESSAGES or _has_lists(rows, renderer):
        if not renderer.tok.chat_template:
            raise ConfigError([f"{data.key}={data.path!r} holds chat messages but the model's "
                               "tokenizer has no chat template; set model.chat_template=<file or "
                               "Jinja string>, or give plain-string rows"])
    outputs = OUTPUT_COLUMNS[fmt] + ("length", "problem")

    def render_batch(batch: dict) -> dict:
        out = {name: [] for name in outputs}
        count = len(next(iter(batch.values())))
        for row in renderer.rows([{name: values[i] for name, values in batch.items()} for i in range(count)]):
            if isinstance(row, RowProblem):
                reason = str(row)
                row = {name: [] for name in outputs if name.endswith("ids") or name == "labels"}
                row.update(answer_json="", extra_json="", length=0, problem=reason)
            else:
                row["problem"] = ""
            for name in outputs:
                out[name].append(row[name])
        return out

    workers = min(os.cpu_count() or 1, 8) if len(rows) >= PARALLEL_FROM_ROWS else None
    import datasets
    datasets.enable_progress_bars()  # the one bar shown: tokenizing is the long part
    try:
        tokenized = rows.map(render_batch, batched=True, batch_size=500, num_proc=workers,
                             remove_columns=rows.column_names, load_from_cache_file=False,
                             cache_file_name=str(written),
                             desc=f"tokenizing {data.key.rsplit('.', 2)[0]} {written.stem.rsplit('-', 1)[-1]}")
    finally:
        datasets.disable_progress_bars()
    bad = _first_problem(tokenized)
    if bad is not None:
        raise ConfigError([f"{data.key}={data.path!r}: row {bad + 1}: {tokenized[bad]['problem']}"])
    return tokenized.remove_columns("problem")


def _first_problem(tokenized) -> int | None:
    """The first row whose `problem` is set, found by Arrow (not row by row in Python)."""
    import pyarrow.compute as pc

    column = tokenized.with_format("arrow")["problem"]
    index = pc.index(pc.not_equal(column, ""), True).as_py()
    return None if index < 0 else index


def _check_columns(data: DataFiles, fmt: str, found: list[str], renderer: Renderer) -> None:
    optional = OPTIONAL_ROLES.get(fmt, ())
    missing = [role for role in ROLES[fmt] if role not in optional and renderer.columns[role] not in found]
    if missing:
        role = missing[0]
        raise ConfigError([
            f"{data.key}={data.path!r}: no column '{renderer.columns[role]}' for the {role} of format "
            f"{fmt}; the rows have {', '.join(found)}. Name your column with "
            f"{data.key.rsplit('.', 1)[0]}.keys.{role}=<column>"])


def _has_lists(rows, renderer: Renderer) -> bool:
    """Do the role columns hold message lists (conversational prompt/completion or pairs)?
    Arrow gives a column one type, so the first row tells."""
    first = rows[0]
    return any(isinstance(first.get(renderer.columns[role]), list)
               for role in ("prompt", "completion", "chosen", "rejected"))
