"""Selective persistence: a save writes only the layers that changed enough.

The ZeRO-0 model-states file (weights + Adam state + scheduler, one pickle) is split on
save into a small skeleton plus one file per layer group (`layers/<group>.pt`: its
weights and their optimizer state). A group whose relative update since its last
persisted version, ||w - w_persisted|| / ||w_persisted||, is at most
`ckpt.selective.threshold` is not written again: the manifest references the file of the
checkpoint that holds it (`references`: checkpoint name + size + chunk hashes, so the
bytes are checked as if they were local). Every `full_every`-th save persists every
group, which bounds how stale a restored layer can be; a frozen group (no update ever)
is written once per stage. Loading assembles the newest persisted version of each group
back into the dict DeepSpeed expects (`assemble`).

Threshold 0 persists every group that changed at all, so a restore is bit-exact.
"""
from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

MODEL_STATES = "mp_rank_00_model_states.pt"
LAYERS_KEY, ORDER_KEY = "baton_layers", "baton_module_order"
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def group_of(name: str) -> str:
    """`model.layers.3.mlp.up_proj.weight` -> `layers.3`; `model.embed_tokens.weight` ->
    `embed_tokens`; `lm_head.weight` -> `lm_head`."""
    found = _LAYER.search(name)
    if found:
        return f"layers.{found.group(1)}"
    parts = [p for p in name.split(".")[:-1] if p != "model"]
    return parts[0] if parts else name


def layer_rel(group: str) -> str:
    return f"layers/{group}.pt"


@dataclass
class Persisted:
    checkpoint: str
    """Name of the checkpoint directory whose `layers/<group>.pt` holds this version."""
    weights: dict[str, torch.Tensor]


@dataclass
class SelectivePolicy:
    threshold: float
    full_every: int
    optimizer_names: list[str] = field(default_factory=list)
    """Parameter name of each optimizer state index (the optimizer's param_groups order)."""
    persisted: dict[str, dict[str, Persisted]] = field(default_factory=dict)
    """checkpoints directory -> group -> its last written version there. A reference never
    crosses directories (a memory-tier save cannot use a run-directory file)."""
    saves: dict[str, int] = field(default_factory=dict)
    last_decision: dict = field(default_factory=dict)

    def split(self, state: dict) -> tuple[dict, dict[str, dict]]:
        """(skeleton, group -> {"module": {...}, "optimizer_state": {idx: {...}}})."""
        groups: dict[str, dict] = {}
        for name, tensor in state["module"].items():
            groups.setdefault(group_of(name), {"module": {}, "optimizer_state": {}})[
                "module"][name] = tensor
        for index, moments in state["optimizer"]["state"].items():
            name = self.optimizer_names[index]
            _check_shape(name, moments, state["module"][name])
            groups[group_of(name)]["optimizer_state"][index] = moments
        skeleton = {k: v for k, v in state.items() if k != "module"}
        skeleton["optimizer"] = {**state["optimizer"], "state": {}}
        skeleton[ORDER_KEY] = list(state["module"])
        skeleton[LAYERS_KEY] = {g: layer_rel(g) for g in groups}
        return skeleton, groups

    def decide(self, groups: dict[str, dict], checkpoint: str, root: str = "") -> dict[str, str]:
        """Which groups this save (into the checkpoints directory `root`) writes; returns
        the others' rel -> the checkpoint of that directory holding it."""
        saves = self.saves[root] = self.saves.get(root, 0) + 1
        full = self.full_every > 0 and saves % self.full_every == 1 % self.full_every
        persisted = self.persisted.setdefault(root, {})
        references, written = {}, []
        for group, parts in groups.items():
            before = persisted.get(group)
            if before is not None and not full and _relative_update(
                    parts["module"], before.weights) <= self.threshold:
                references[layer_rel(group)] = before.checkpoint
                continue
            written.append(group)
            persisted[group] = Persisted(
                checkpoint, {n: t.detach().clone() for n, t in parts["module"].items()})
        self.last_decision = {"full": full, "written": written,
                              "referenced": sorted(references)}
        return references


def _relative_update(now: dict[str, torch.Tensor], before: dict[str, torch.Tensor]) -> float:
    if set(now) != set(before):
        return float("inf")
    delta = sum(float((now[n].double() - before[n].double()).pow(2).sum()) for n in now)
    base = sum(float(before[n].double().pow(2).sum()) for n in now)
    if delta == 0.0:
        return 0.0
    return (delta / base) ** 0.5 if base > 0 else float("inf")


def _check_shape(name: str, moments: dict, weight: torch.Tensor) -> None:
    avg = moments.get("exp_avg")
    if avg is not None and tuple(avg.shape) != tuple(weight.shape):
        raise ValueError(f"optimizer state of {name} has shape {tuple(avg.shape)}, the weight "
                         f"{tuple(weight.shape)}: the optimizer's parameter order is not the "
                         "module's, so layers cannot be saved selectively")


def is_layered(state) -> bool:
    return isinstance(state, dict) and LAYERS_KEY in state


def assemble(skeleton: dict, load_rel) -> dict:
    """The model-states dict DeepSpeed wrote, rebuilt from the skeleton and each group's
    file (`load_rel(rel)`: its verified, weights_only-loaded content)."""
    state = dict(skeleton)
    module: OrderedDict = OrderedDict((name, None) for name in state.pop(ORDER_KEY))
    moments: dict = {}
    for rel in state.pop(LAYERS_KEY).values():
        part = load_rel(rel)
        module.update(part["module"])
        moments.update(part["optimizer_state"])
    missing = [name for name, tensor in module.items() if tensor is None]
    if missing:
        raise ValueError(f"no layer file holds {', '.join(missing[:5])}")
    state["module"] = module
    state["optimizer"] = {**state["optimizer"], "state": dict(sorted(moments.items()))}
    return state
