"""Ratios of measured numbers: each method against the bounds and the two anchors.

Every ratio is computed here from the summary numbers in the JSON and nowhere else, with
its name saying what it divides: `<numerator>_over_<denominator>_<min|median>` compares
mins with mins and medians with medians.
"""
from __future__ import annotations

from bench.methods.base import ANCHOR_DCP_ASYNC, ANCHOR_DEEPSPEED
from bench.methods.bounds import BOUND_NAMES, MEMCPY, WRITE_DD, WRITE_PYTHON

STATS = ("min", "median")
ANCHORS = {"deepspeed": ANCHOR_DEEPSPEED, "dcp_async": ANCHOR_DCP_ASYNC}


def bounds(measured: dict[str, dict]) -> dict:
    """`bounds` of the JSON from the bound rows: memcpy, and the faster of the two writes."""
    result: dict = {}
    memcpy = measured.get(MEMCPY)
    if memcpy is not None:
        result["memcpy_s"] = memcpy["stall_s_min"]
        result["memcpy_s_median"] = memcpy["stall_s_median"]
        result["bytes"] = memcpy["bytes"]
    writes = [measured[n] for n in (WRITE_PYTHON, WRITE_DD) if n in measured]
    if writes:
        result["write_s"] = min(w["durable_s_min"] for w in writes)
        result["write_s_median"] = min(w["durable_s_median"] for w in writes)
        result["write_bytes"] = writes[0]["bytes"]
    for name, key in ((WRITE_PYTHON, "write_python"), (WRITE_DD, "write_dd")):
        if name in measured:
            result[f"{key}_s"] = measured[name]["durable_s_min"]
            result[f"{key}_s_median"] = measured[name]["durable_s_median"]
    return result


def add_ratios(method: dict, bound: dict, anchors: dict[str, dict], state_bytes: int) -> dict:
    """The method's summary with its ratios added (a ratio whose denominator was not
    measured is left out, never guessed)."""
    out = dict(method)
    for stat in STATS:
        memcpy = bound.get("memcpy_s" if stat == "min" else "memcpy_s_median")
        write = bound.get("write_s" if stat == "min" else "write_s_median")
        stall, durable = method[f"stall_s_{stat}"], method[f"durable_s_{stat}"]
        if memcpy:
            out[f"stall_over_memcpy_{stat}"] = stall / memcpy
        if write:
            out[f"durable_over_write_{stat}"] = durable / write
            # Throughput, so a method writing a few more bytes than the bound is not charged.
            out[f"throughput_over_write_{stat}"] = ((method["bytes"] / durable)
                                                    / (bound["write_bytes"] / write))
        for key, anchor in anchors.items():
            out[f"stall_over_{key}_{stat}"] = stall / anchor[f"stall_s_{stat}"]
            out[f"durable_over_{key}_{stat}"] = durable / anchor[f"durable_s_{stat}"]
        out.update(_in_step_ratios(method, stat, memcpy, anchors))
    if state_bytes:
        out["peak_extra_rss_over_state"] = method["peak_extra_rss_bytes"] / state_bytes
    return out


def _in_step_ratios(method: dict, stat: str, memcpy: float | None, anchors: dict) -> dict:
    """The stall of a save inside a training step against the memcpy bound and against
    each anchor's own stall in a step (the same rounds, the same step)."""
    stall = method.get(f"step_stall_s_{stat}")
    if stall is None:
        return {}
    out = {f"step_stall_over_memcpy_{stat}": stall / memcpy} if memcpy else {}
    for key, anchor in anchors.items():
        if anchor.get(f"step_stall_s_{stat}"):
            out[f"step_stall_over_{key}_{stat}"] = stall / anchor[f"step_stall_s_{stat}"]
    return out


def with_ratios(summaries: list[dict], state_bytes: int) -> tuple[dict, list[dict]]:
    """(bounds, methods with ratios) from every measured row; the bound rows themselves
    go into `bounds["rows"]`, not among the methods."""
    by_name = {s["name"]: s for s in summaries}
    bound = bounds(by_name)
    anchors = {key: by_name[name] for key, name in ANCHORS.items() if name in by_name}
    methods = [add_ratios(s, bound, anchors, state_bytes) for s in summaries
               if s["name"] not in BOUND_NAMES]
    bound["rows"] = [s for s in summaries if s["name"] in BOUND_NAMES]
    return bound, methods
