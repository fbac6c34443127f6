"""Training state baton captures beside DeepSpeed's files: RNG bundle and progress counters.

Both speak state_dict()/load_state_dict() and serialise to JSON (no pickle): torch
RNG states are byte tensors, stored as base64.
"""
from __future__ import annotations

import base64
import random
from dataclasses import asdict, dataclass

import numpy as np
import torch

PYTHON, NUMPY, TORCH, CUDA = "python", "numpy", "torch", "cuda"


def _b64(tensor: torch.Tensor) -> str:
    return base64.b64encode(tensor.numpy().tobytes()).decode()


def _unb64(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


def derived_seed(seed: int, stage: str, rank: int) -> int:
    """Per-rank seed derived from the recorded root seed, stage and rank (world-size free)."""
    return int(np.random.SeedSequence([seed, sum(map(ord, stage)), rank]).generate_state(1)[0])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class RngState:
    """Python, numpy, torch CPU and (when present) CUDA generator states of this process."""

    @staticmethod
    def state_dict() -> dict:
        version, internal, gauss = random.getstate()
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state = {
            PYTHON: {"version": version, "state": list(internal), "gauss": gauss},
            NUMPY: {"kind": kind, "keys": keys.tolist(), "pos": int(pos),
                    "has_gauss": int(has_gauss), "cached": float(cached)},
            TORCH: _b64(torch.get_rng_state()),
        }
        if torch.cuda.is_available():
            state[CUDA] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
        return state

    @staticmethod
    def load_state_dict(state: dict) -> None:
        py = state[PYTHON]
        random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
        n = state[NUMPY]
        np.random.set_state((n["kind"], np.array(n["keys"], dtype=np.uint32), n["pos"],
                             n["has_gauss"], n["cached"]))
        torch.set_rng_state(_unb64(state[TORCH]))
        if CUDA in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([_unb64(s) for s in state[CUDA]])


@dataclass
class TrainingProgress:
    """Counters of a stage run; `micro_in_window` > 0 means saved mid-accumulation."""

    step: int = 0
    micro_step: int = 0
    micro_in_window: int = 0
    tokens_seen: int = 0
    samples_seen: int = 0

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, int(value))
