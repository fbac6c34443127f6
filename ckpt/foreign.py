"""Recognise checkpoints baton did not write: a plain DeepSpeed save or a Hugging Face
model directory. Only file names (and a Hugging Face shard index, JSON) are looked at
here; nothing is unpickled.

`verify` uses `refusal` to say what a directory without a manifest is (a foreign
checkpoint, not a save that never finished); `baton ckpt adopt` uses `detect` to find
the weight files it brings in.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ckpt.errors import ForeignCheckpoint, NotACheckpoint

DEEPSPEED, HF = "deepspeed", "hf"
DS_LATEST = "latest"
# DeepSpeed's own names: mp_rank_00_model_states.pt (ZeRO 0-2),
# [bf16_]zero_pp_rank_R_mp_rank_00_{model,optim}_states.pt (ZeRO 1-3).
MODEL_STATES = "*model_states.pt"
OPTIM_STATES = "*optim_states.pt"
_ZERO3_MODEL = re.compile(r"^zero_pp_rank_\d+_mp_rank_\d+_model_states\.pt$")
HF_CONFIG = "config.json"
HF_SAFETENSORS = "*.safetensors"
HF_BIN = ("pytorch_model.bin", "pytorch_model-*.bin")
# (shard index, single file) in the order transformers prefers them.
HF_WEIGHTS = (("model.safetensors.index.json", "model.safetensors"),
              ("pytorch_model.bin.index.json", "pytorch_model.bin"))
# Files only a baton save writes: with them, a missing manifest means an unfinished save.
BATON_FILES = ("meta.json", "progress.json", "data.json", "rng")


@dataclass
class Foreign:
    kind: str
    """DEEPSPEED or HF."""
    directory: Path
    """Where the weight files are (a DeepSpeed tag directory, or the HF directory)."""
    files: list[str] = field(default_factory=list)
    """Weight files, relative to `directory`."""
    root: Path | None = None
    """A DeepSpeed checkpoint root whose `latest` file named `directory`."""

    @property
    def zero3(self) -> bool:
        return any(_ZERO3_MODEL.match(f) for f in self.files)


def _names(directory: Path, pattern: str) -> list[str]:
    return sorted(p.name for p in directory.glob(pattern) if p.is_file())


def _deepspeed_tag(directory: Path) -> Foreign | None:
    model_files = _names(directory, MODEL_STATES)
    if not model_files:
        return None
    optim_files = _names(directory, OPTIM_STATES)
    return Foreign(DEEPSPEED, directory, model_files + optim_files)


def _indexed(directory: Path, index: str) -> list[str]:
    """Shard files a `*.index.json` names (its `weight_map` values), [] if unusable."""
    try:
        weight_map = json.loads((directory / index).read_text(encoding="utf-8"))["weight_map"]
        names = sorted(set(weight_map.values()))
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        return []
    ok = all(isinstance(n, str) and "/" not in n and (directory / n).is_file() for n in names)
    return names if ok else []


def _hf(directory: Path) -> Foreign | None:
    """The weights transformers would load: an index's shards, else the single file, else
    whatever safetensors / bin files there are."""
    if not (directory / HF_CONFIG).is_file():
        return None
    for index, single in HF_WEIGHTS:
        weights = (_indexed(directory, index) if (directory / index).is_file()
                   else [single] if (directory / single).is_file() else [])
        if weights:
            return Foreign(HF, directory, weights)
    weights = _names(directory, HF_SAFETENSORS)
    if not weights:
        weights = sorted({n for pattern in HF_BIN for n in _names(directory, pattern)})
    return Foreign(HF, directory, weights) if weights else None


def latest_tag(root: Path) -> Path | None:
    """The tag directory a DeepSpeed (or baton) `latest` file names, if it exists."""
    pointer = root / DS_LATEST
    if not pointer.is_file():
        return None
    try:
        name = pointer.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    tag = root / name
    # A tag is one directory name inside the root, never a path out of it.
    if not name or "/" in name or name in (".", "..") or not tag.is_dir():
        return None
    return tag


def is_baton_save(directory: Path) -> bool:
    return any((directory / name).exists() for name in BATON_FILES)


def detect(directory: str | Path) -> Foreign | None:
    """A foreign checkpoint at `directory` (a DeepSpeed tag directory or root, or a HF
    model directory); None when it is none of them or holds baton's own files."""
    directory = Path(directory)
    if not directory.is_dir() or is_baton_save(directory):
        return None
    found = _deepspeed_tag(directory) or _hf(directory)
    if found is not None:
        return found
    tag = latest_tag(directory)
    if tag is None or is_baton_save(tag) or (tag / "manifest.json").exists():
        return None
    found = _deepspeed_tag(tag)
    if found is not None:
        found.root = directory
    return found


def refusal(directory: str | Path) -> NotACheckpoint | None:
    """The error that says what a directory without a baton manifest is, and what to do
    with it; None when it looks like nothing known (an unfinished or unrelated directory)."""
    directory = Path(directory)
    tag = latest_tag(directory) if directory.is_dir() else None
    if tag is not None and (tag / "manifest.json").is_file():
        return NotACheckpoint(directory, f"a directory of baton checkpoints, not one checkpoint; "
                              f"its `latest` file names {tag.name}: use {tag}")
    found = detect(directory)
    if found is None:
        return None
    shown = ", ".join(found.files[:3]) + (", …" if len(found.files) > 3 else "")
    if found.kind == HF:
        return ForeignCheckpoint(directory, HF, (
            f"a Hugging Face model directory ({HF_CONFIG} + {shown}) without a baton manifest, "
            f"not a baton checkpoint; train from it with model.path={directory}, or bring it in "
            f"as a checkpoint with `baton ckpt adopt {directory}`"))
    where = (f"a DeepSpeed checkpoint root (`latest` names {found.directory.name}: {shown})"
             if found.root is not None else f"a DeepSpeed checkpoint ({shown})")
    return ForeignCheckpoint(directory, DEEPSPEED, (
        f"{where} without a baton manifest, not a baton checkpoint; use `baton ckpt adopt "
        f"{directory}` to bring it in, then use the adopted copy as stage.init_from"))
