"""A resume reads the same data the checkpoint was trained on, or says it does not.

The sampler's saved position is an index into the dataset's rows: on changed rows it
would silently point at other examples. So a resume compares the content digests the
checkpoint recorded (meta.json "data_plan") with the data configured now, and refuses a
difference by name unless data.allow_changed=true, which the plan then records.
"""
from __future__ import annotations

import json

from core.errors import ConfigError

SPLITS = ("train", "eval")


def check_same_data(cfg, plan: dict | None) -> None:
    """Refuse (or, with data.allow_changed, record in `plan`) a resume onto other data."""
    from ckpt.layout import checkpoints_dir, resolve_resume
    from ckpt.state_files import META

    target = resolve_resume(cfg.resume, checkpoints_dir(cfg.run.dir, cfg.stage.name))
    try:
        meta = json.loads((target / META).read_text()) if target is not None else None
    except (OSError, ValueError):
        return  # no checkpoint there, or a damaged one: the verified load names the problem
    if not isinstance(meta, dict):
        return
    try:
        changed = changes(meta.get("data_plan"), plan)
    except (KeyError, TypeError, AttributeError):  # a data record of another shape
        changed = [f"its meta.json records its data as {str(meta.get('data_plan'))[:80]!r}, which is not "
                   "a data plan this baton reads"]
    if not changed:
        return
    if cfg.data.allow_changed:
        if plan is not None:
            plan["allowed_change"] = {"checkpoint": str(target), "changes": changed}
        return
    raise ConfigError([f"resume={cfg.resume!r}: {target} was trained on other data: "
                       + "; ".join(changed) + ". Its data position would point at other rows. "
                       "Restore the data it was trained on, start the stage afresh (a new run.dir "
                       "or without resume), or set data.allow_changed=true to resume anyway "
                       "(recorded in lineage)"])


def changes(saved: dict | None, plan: dict | None, then: str = "the checkpoint") -> list[str]:
    """One line per dataset whose content differs between a checkpoint (or an original run:
    `then`) and now."""
    if saved is None and plan is None:
        return []
    if saved is None or plan is None:
        before = "the built-in tasks" if saved is None else f"{saved['train']['path']}"
        now = "the built-in tasks" if plan is None else f"{plan['train']['path']}"
        return [f"{then} trained on {before}, this run is configured with {now}"]
    found = []
    for split in SPLITS:
        old, new = saved[split].get("digest"), plan[split].get("digest")
        if old != new:
            where = plan[split].get("path") or f"{plan['train']['path']} (held-out share)"
            found.append(f"{split} data {where} has content {new}, {then}'s had {old}")
    if not found:  # same files, other rows: a held-out share drawn differently, other tokens
        split_of = lambda p: {k: p["eval"].get(k) for k in ("from", "fraction", "seed", "rows")}  # noqa: E731
        if split_of(saved) != split_of(plan) or saved["train"].get("rows") != plan["train"].get("rows"):
            found.append(f"the held-out split of {plan['train']['path']} differs ({split_of(plan)}, "
                         f"{then}'s {split_of(saved)}), so train holds other rows")
    return found
