"""What a stage starts from, checked before any worker starts.

A bad model directory or starting checkpoint used to surface inside the workers, as
one traceback per rank under torchrun's report. Here each problem becomes one line of
a `ConfigError` naming the key, the value, what is wrong and the fix — and nothing is
unpickled on the way: safetensors headers are parsed, a `pytorch_model.bin` must load
with `weights_only=True`, and checkpoints are verified against their manifests.
"""
from __future__ import annotations

import json
from pathlib import Path

from core.errors import ConfigError

# HF file names (transformers.utils.SAFE_WEIGHTS_NAME etc.), spelled out to stay import-free.
SAFE_WEIGHTS, SAFE_INDEX = "model.safetensors", "model.safetensors.index.json"
BIN_WEIGHTS, BIN_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# Checkpoints that hold a causal-LM policy. Every policy handoff (flows/handoff_task.py:
# cpt->sft, sft->rm, sft->rl) starts from one; a reward model is only ever loaded frozen,
# through stage.reward_model_from.
POLICY_STAGES = ("cpt", "sft")
CHECKPOINT_KEYS = {"init_from": POLICY_STAGES, "reference_from": POLICY_STAGES,
                   "reward_model_from": ("rm",)}


def check_stage_inputs(cfg) -> None:
    """Raise ConfigError listing every problem with model.path and the starting checkpoints."""
    found = model_dir_problems(cfg.model.path) if cfg.model.path else []
    s = cfg.stage
    # Checked at launch, not when composing: in a pipeline the rm->rl handoff supplies
    # reward_model_from only once the RM stage has run.
    if s.name == "rl" and s.reward_model_weight > 0 and s.reward_model_from is None:
        found.append(f"stage.reward_model_weight={s.reward_model_weight} needs "
                     "stage.reward_model_from=<rm checkpoint>; or set reward_model_weight=0")
    for key, allowed in CHECKPOINT_KEYS.items():
        value = getattr(cfg.stage, key, None)
        if value:
            found += checkpoint_problems(f"stage.{key}", value, allowed)
    if found:
        raise ConfigError(found)


def model_dir_problems(path: str | Path) -> list[str]:
    key, directory = f"model.path={str(path)!r}", Path(path)
    fix = "expected a local Hugging Face causal-LM directory as written by save_pretrained"
    if not directory.is_dir():
        return [f"{key}: no such directory; {fix} (or model.path=null for the built-in model)"]
    found = _config_problems(key, directory / "config.json", fix)
    found += _weights_problems(key, directory)
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        found.append(f"{key}: no tokenizer (none of {', '.join(TOKENIZER_FILES)}); save the "
                     "tokenizer into the same directory (tokenizer.save_pretrained)")
    return found


def _config_problems(key: str, path: Path, fix: str) -> list[str]:
    if not path.is_file():
        return [f"{key}: no config.json there; {fix} (or model.path=null for the built-in model)"]
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return [f"{key}: config.json is not valid JSON ({exc}); {fix}"]
    if not isinstance(config, dict):
        return [f"{key}: config.json holds a {type(config).__name__}, not a JSON object; {fix}"]
    if not config.get("model_type") and not config.get("architectures"):
        return [f"{key}: config.json has neither 'model_type' nor 'architectures', so "
                f"transformers cannot tell which model it describes; {fix}"]
    return []


def _weights_problems(key: str, directory: Path) -> list[str]:
    for index_name, check in ((SAFE_INDEX, _safetensors_problem), (BIN_INDEX, _bin_problem)):
        if (directory / index_name).is_file():
            return _sharded_problems(key, directory, index_name, check)
    for name, check in ((SAFE_WEIGHTS, _safetensors_problem), (BIN_WEIGHTS, _bin_problem)):
        if (directory / name).is_file():
            problem = check(directory / name)
            return [f"{key}: {name} {problem}"] if problem else []
    return [f"{key}: no weights there (expected {SAFE_WEIGHTS}, a sharded {SAFE_INDEX} or "
            f"{BIN_WEIGHTS}); save the model with save_pretrained"]


def _sharded_problems(key: str, directory: Path, index_name: str, check) -> list[str]:
    try:
        index = json.loads((directory / index_name).read_text(encoding="utf-8"))
        shards = sorted(set(index["weight_map"].values()))
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return [f"{key}: {index_name} is not a valid shard index ({type(exc).__name__}: {exc}); "
                "expected a JSON object with a 'weight_map' of parameter -> shard file"]
    found = []
    for shard in shards:
        path = directory / shard
        problem = "is missing" if not path.is_file() else check(path)
        if problem:
            found.append(f"{key}: shard {shard} listed in {index_name} {problem}")
    return found


def _safetensors_problem(path: Path) -> str | None:
    """Parse the header only (no tensor is read): names, dtypes, shapes, offsets that cover
    the file exactly."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as handle:
            handle.keys()
    except Exception as exc:  # SafetensorError and I/O errors: the file is unusable either way
        return (f"is not a readable safetensors file ({exc}); re-save the model "
                "(save_pretrained(..., safe_serialization=True))")
    return None


def _bin_problem(path: Path) -> str | None:
    """A pickle is loaded only with weights_only=True (memory-mapped, nothing executed)."""
    import torch

    try:
        torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # UnpicklingError, RuntimeError (not a zip), EOFError, ...
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return (f"cannot be loaded with weights_only=True ({type(exc).__name__}: {first}); "
                "baton never unpickles arbitrary objects: convert the model to safetensors "
                "(save_pretrained(..., safe_serialization=True)) where it came from")
    return None


def checkpoint_problems(key: str, value: str, allowed: tuple[str, ...]) -> list[str]:
    """A starting checkpoint must verify (manifest, sizes, checksums) and be of a stage
    whose weights this key can take."""
    from ckpt import manifest as manifest_io
    from ckpt.errors import CheckpointError
    from ckpt.layout import LATEST

    path = Path(value)
    if path.is_file() and path.name == LATEST:
        target = path.parent / path.read_text().strip()
        return [f"{key}={value!r} is the `latest` pointer, not a checkpoint; pass the "
                f"directory it names: {key}={target}"]
    try:
        manifest = manifest_io.verify(path)
    except CheckpointError as exc:
        return [f"{key}: {exc}"]
    if manifest.stage not in allowed:
        return [f"{key}={value!r} is a '{manifest.stage}' checkpoint; {key} takes a checkpoint "
                f"of stage {' or '.join(allowed)}"
                + ("; a reward model is passed as stage.reward_model_from"
                   if manifest.stage == "rm" else "")]
    return []
