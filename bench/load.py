"""Loading the same checkpoint files two ways, interleaved: `torch.load` from the path,
and baton's verified load (each file read once, hashed while read, deserialized from
those same bytes with the weights_only allow-list). Both read from the page cache: the
files were just written, and the bench cannot drop caches without root."""
from __future__ import annotations

import statistics
import time
from pathlib import Path

from bench.console import progress
from bench.memory import settle


def pickle_files(directory: Path) -> list[str]:
    from ckpt import manifest as manifest_io
    from ckpt.reader import pickle_files as pickles

    return pickles(manifest_io.read(directory))


def torch_load(directory: Path, files: list[str]) -> None:
    import torch

    from ckpt.safe_load import allow_deepspeed_globals

    allow_deepspeed_globals()  # the same allow-list, so both sides unpickle alike
    for rel in files:
        torch.load(directory / rel, map_location="cpu", weights_only=True)


def verified_load(directory: Path, files: list[str]) -> None:
    from ckpt import manifest as manifest_io
    from ckpt.reader import CheckpointReader

    reader = CheckpointReader(directory, manifest_io.read(directory))  # signed, confined
    for rel in files:
        reader.torch(rel)


def timed(load, directory: Path, files: list[str]) -> float:
    settle()
    start = time.perf_counter()
    load(directory, files)
    return time.perf_counter() - start


def compare_loads(directory: Path, rounds: int, label: str) -> dict:
    files = pickle_files(directory)
    plain, verified = [], []
    for index in range(rounds):
        pair = [(torch_load, plain), (verified_load, verified)]
        for load, times in (pair if index % 2 == 0 else pair[::-1]):
            times.append(timed(load, directory, files))
        progress(f"{label} load round {index + 1}/{rounds}: torch.load {plain[-1]:.3f} s, "
                 f"verified {verified[-1]:.3f} s")
    result = {"checkpoint": directory.name, "files": len(files),
              "bytes": sum((directory / rel).stat().st_size for rel in files)}
    for stat, pick in (("min", min), ("median", statistics.median)):
        result[f"torch_load_s_{stat}"] = pick(plain)
        result[f"verified_load_s_{stat}"] = pick(verified)
        result[f"verified_over_torch_load_{stat}"] = pick(verified) / pick(plain)
    return result
