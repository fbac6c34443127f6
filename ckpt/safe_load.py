"""The one place checkpoint pickles are deserialized: `weights_only` loads with an allow-list.

A checksum proves only that bytes match their manifest, and whoever can write the files
can write the manifest too. So no pickle is trusted: every `torch.load` runs torch's
`weights_only` unpickler, which builds tensors, plain containers and the DeepSpeed
classes allow-listed below, and refuses any other global before calling it (so no
`__reduce__` payload runs).

DeepSpeed's own helpers (`ds_to_universal`, `zero_to_fp32`, the universal loader) call
`torch.load(..., weights_only=False)`. `forced_safe_load()` and `install()` set torch's
`TORCH_FORCE_WEIGHTS_ONLY_LOAD`, which `torch.load` itself checks on every call and which
overrides that argument; child processes (torchrun workers) inherit it.
"""
from __future__ import annotations

import contextlib
import io
import os
import pickle
import re
import threading
from pathlib import Path

FORCE_ENV = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
# torch refuses to load at all when both are set; ours must win, so this one is lifted.
UNFORCE_ENV = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
# Files a loader may hand to torch.load: DeepSpeed writes `.pt`; Hugging Face `.bin`.
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".pkl", ".ckpt")

# The allow-list by name (`deepspeed_globals` are the classes): the scan compares names, so
# `baton ckpt verify` need not import DeepSpeed.
DEEPSPEED_ALLOWED = (
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.utils.tensor_fragment.fragment_address",
)

_lock = threading.Lock()
_depth = 0  # forced_safe_load() contexts open (install() holds one forever)
_saved_env: dict[str, str | None] = {}
_registered = False


def deepspeed_globals() -> list:
    """Classes DeepSpeed pickles into its checkpoint files (the optimizer states' loss
    scaler, ZeRO stage and fragment addresses; fp16 runs' dynamic scaler). None has a
    `__setstate__` or `__reduce__` of its own and their constructors only store numbers,
    so rebuilding one runs no code of the file's choosing. DeepSpeed's `DeepSpeedConfig`
    is deliberately absent: checkpoints hold the config as a dict, and its constructor
    reads files and sets up the process."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, fragment_address, ZeroStageEnum]


def allow_deepspeed_globals() -> None:
    """Register the allow-list with torch once per process."""
    global _registered
    if not _registered:
        import torch

        torch.serialization.add_safe_globals(deepspeed_globals())
        _registered = True


_allow_deepspeed_globals = allow_deepspeed_globals  # the name ckpt.engine used to export


def allowed_names() -> list[str]:
    """The allow-list as `module.qualname`, from the classes themselves."""
    return sorted(f"{c.__module__}.{c.__qualname__}" for c in deepspeed_globals())


def is_pickle_name(rel: str) -> bool:
    return rel.lower().endswith(PICKLE_SUFFIXES)


def unsafe_globals(source: bytes | Path) -> list[str]:
    """What a weights_only load would refuse in a torch.save archive, found by reading its
    pickle opcodes only: nothing is built and no tensor data is read."""
    import torch

    handle = str(source) if isinstance(source, (str, Path)) else io.BytesIO(source)
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(handle)
        return sorted(set(found) - set(DEEPSPEED_ALLOWED))
    except (pickle.UnpicklingError, ValueError, RuntimeError, EOFError, KeyError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return [f"not a plain torch.save archive: {first[:200]}"]


def check_pickle(source: bytes | Path, path) -> None:
    """Raise UnsafeCheckpoint naming `path` if `source` holds anything off the allow-list."""
    from ckpt.errors import UnsafeCheckpoint

    found = unsafe_globals(source)
    if found:
        raise UnsafeCheckpoint(path, found)


def check_pickles(directory: str | Path, manifest) -> None:
    """The allow-list scan over every pickle a manifest lists (files already verified):
    lets `verify`, and every command that verifies first, refuse a hostile file by name
    before anything tries to load it. The loads themselves stay weights_only."""
    from ckpt.layout import referenced_path

    for rel in sorted(manifest.files):
        if is_pickle_name(rel):
            check_pickle(Path(directory) / rel, Path(directory) / rel)
    for rel, entry in sorted(getattr(manifest, "references", {}).items()):
        if is_pickle_name(rel):  # a layer file kept in an earlier checkpoint (ckpt.selective)
            path = referenced_path(Path(directory), rel, entry)
            check_pickle(path, path)


def _refusal(exc: BaseException, data: bytes | None) -> list[str]:
    """What the unpickler refused, without torch's advice to allow-list it."""
    found = unsafe_globals(data) if data is not None else []
    if found:
        return found
    text = " ".join(str(exc).split())
    named = re.search(r"GLOBAL ([\w.]+) was not an allowed global", text)
    if named:
        return [named.group(1)]
    other = re.search(r"(Unsupported operand \d+|unrecognized function \S+|Can only create new "
                      r"object for nn\.Parameter or classes allowlisted via `add_safe_globals` "
                      r"but got \S+)", text)
    return [other.group(1) if other else text[:200] or "refused by the weights_only unpickler"]


def load_verified_bytes(data: bytes, path, map_location="cpu"):
    """Deserialize bytes already checked against their manifest; `path` names them in errors.
    A pickle the allow-list refuses raises UnsafeCheckpoint; one that is not a torch
    archive at all raises UnreadablePayload."""
    import torch

    from ckpt.errors import UnreadablePayload, UnsafeCheckpoint

    import numpy as np

    from ckpt.buffer_load import BufferFile, load_weights_only

    allow_deepspeed_globals()
    try:
        if isinstance(data, (bytearray, np.ndarray)):  # ours alone: storages are slices of it
            return load_weights_only(data, map_location)
        return torch.load(BufferFile(data), map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise UnsafeCheckpoint(path, _refusal(exc, data)) from None
    except (RuntimeError, EOFError, ValueError, AttributeError, TypeError, KeyError,
            IndexError) as exc:  # a well-hashed file that is no sound torch archive
        path = Path(path)
        raise UnreadablePayload(path.parent, path.name, exc) from None


def load_file(path: str | Path, map_location="cpu"):
    """A weights_only load of a file this process trusts by other means (a universal folder
    checked against the fingerprint its writer recorded)."""
    path = Path(path)
    return load_verified_bytes(path.read_bytes(), path, map_location)


def _force(on: bool) -> None:
    """Open (on) or close one forcing; the environment is restored when the last closes."""
    global _depth
    with _lock:
        if on:
            if _depth == 0:
                _saved_env.update({k: os.environ.get(k) for k in (FORCE_ENV, UNFORCE_ENV)})
                os.environ[FORCE_ENV] = "1"
                os.environ.pop(UNFORCE_ENV, None)
            _depth += 1
            return
        _depth -= 1
        if _depth == 0:
            for key, value in _saved_env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


@contextlib.contextmanager
def forced_safe_load(source=None):
    """Every torch.load inside runs weights_only with the allow-list, whatever its caller
    passes. A refusal inside a helper that does not say which file becomes
    UnsafeCheckpoint naming `source` (the checkpoint being converted)."""
    allow_deepspeed_globals()
    _force(True)
    try:
        yield
    except pickle.UnpicklingError as exc:
        from ckpt.errors import UnsafeCheckpoint

        raise UnsafeCheckpoint(source or "checkpoint", _refusal(exc, None)) from None
    finally:
        _force(False)


def install() -> None:
    """Force weights_only loads for the rest of this process and its children (workers
    call it first thing: DeepSpeed's loaders run inside them)."""
    allow_deepspeed_globals()
    _force(True)


def forced() -> bool:
    return os.environ.get(FORCE_ENV, "").lower() in ("1", "y", "yes", "true")
