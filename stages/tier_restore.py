"""`resume=latest` with checkpoint tiers: find the newest verified copy in any tier,
fastest first, before any worker starts (ckpt.tiers.restore), and record the choice;
across nodes, the workers then agree on one checkpoint every rank can load."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from ckpt.layout import position_of, stage_dir
from ckpt.tiers.plan import TierPlan
from ckpt.tiers.restore import checkpoint_name, restore
from core.errors import BatonError
from stages.nodes import node_file

RESTORE_RECORD = "restore.json"


def restore_latest(cfg) -> str | None:
    """The directory to resume from (None: no tier holds a sound copy; start at step 0).
    Writes `<stage dir>/restore.json` (`restore-node-K.json` on node K) and says which tier it used and what fell through."""
    plan = TierPlan.from_config(cfg)
    directory = stage_dir(cfg.run.dir, cfg.stage.name)
    directory.mkdir(parents=True, exist_ok=True)
    # Per node: every node's launcher restores for its own ranks, into its own staging.
    restored = restore(plan, node_file(directory, "restored", cfg.parallel))
    record = node_file(directory, RESTORE_RECORD, cfg.parallel)
    record.write_text(json.dumps(restored.to_dict(), indent=1))
    for skipped in restored.fell_through:
        what = f"{skipped['name']} in the {skipped['tier']} tier" if skipped["name"] else \
            f"the {skipped['tier']} tier"
        print(f"[baton] restore: skipped {what}: {skipped['reason']}", flush=True)
    if restored.path is None:
        print("[baton] restore: no tier holds a verified checkpoint of this stage; "
              "starting at step 0", flush=True)
        return None
    print(f"[baton] restore: {restored.name} from the {restored.tier} tier "
          f"({restored.seconds:.2f} s to find and verify)", flush=True)
    return str(restored.path)


def agree_across_nodes(cfg, path: str | None, rank: int, world: int) -> str | None:
    """Workers, across nodes with tiers: every rank resumes from the same checkpoint.

    Each node's launcher restored on its own (ranks are not known yet), so two nodes may
    hold different newest steps (a node's commit failed, its tmpfs was wiped), and a node
    copy serves only its own ranks. Every rank offers the newest checkpoint it can load,
    as (name, save id): two copies of one step from different saves (a restart re-saved
    the step on one node only) have the same name but different ids. While the offers
    differ, every rank asks again for the oldest name offered or older; when only the ids
    differ, for an older step. The positions only go down, so this ends, at worst on none
    (step 0). Collective: every rank calls it."""
    import torch.distributed as dist

    from ckpt.manifest import read as read_manifest
    from ckpt.node_copies import serves

    plan = TierPlan.from_config(cfg)
    staging = stage_dir(cfg.run.dir, cfg.stage.name) / f"restored-rank-{rank}"
    offer = Path(path) if path else None
    if offer is not None and not serves(read_manifest(offer).extra, rank):
        offer = _again(plan, staging, rank, not_after=checkpoint_name(offer))
    while True:
        offers: list[tuple[str, str | None] | None] = [None] * world
        mine = offer_of(offer)
        dist.all_gather_object(offers, mine)
        step = next_step(offers)
        if step is AGREED:
            if offer is None or not offer.is_relative_to(staging):
                shutil.rmtree(staging, ignore_errors=True)  # a fetched copy no rank loads
            return str(offer) if offer is not None else None
        if step is None:
            offer = None
        elif step[0] == "before" or mine is None or mine[0] != step[1]:
            offer = _again(plan, staging, rank, **{step[0]: step[1]})


AGREED = ("agreed", None)


def offer_of(path: Path | None) -> tuple[str, str | None] | None:
    """(checkpoint name, save id) of a restored copy: a node copy's `extra.node.save`, a
    whole checkpoint's content digest (the same in every tier's copy of it)."""
    if path is None:
        return None
    from ckpt.content_digest import content_digest
    from ckpt.manifest import read as read_manifest
    from ckpt.node_copies import NODE

    manifest = read_manifest(path)
    node = manifest.extra.get(NODE)
    return checkpoint_name(path), (node.get("save") if node is not None else content_digest(manifest))


def next_step(offers: list) -> tuple[str, str] | tuple[str, None] | None:
    """What every rank does after seeing every rank's offer: AGREED; ("not_after", name):
    each rank not offering `name` looks for it or older; ("before", name): every rank
    looks for an older step; None: some rank has nothing, so every rank starts at step 0.
    The first item is the keyword `restore` takes the bound as."""
    if len(set(offers)) == 1:
        return AGREED
    if any(o is None for o in offers):
        return None
    names = {name for name, _ in offers}
    unnamed = sorted(name for name in names if position_of(name) is None)
    if unnamed:
        what = (f"copies of {unnamed[0]} from different saves" if len(names) == 1
                else f"different checkpoints ({', '.join(sorted(names))})")
        raise BatonError(
            f"resume: the ranks would resume from {what}, and {unnamed[0]} is not a step "
            "directory, so no older step can be looked for; pass the same checkpoint on "
            "every node, or resume=latest")
    if len(names) == 1:  # one step, copies from different saves: none of them is shared
        return ("before", names.pop())
    return ("not_after", min(names, key=position_of))


def _again(plan: TierPlan, staging: Path, rank: int, not_after: str | None = None,
           before: str | None = None) -> Path | None:
    restored = restore(plan, staging, rank=rank, not_after=not_after, before=before)
    for skipped in restored.fell_through:
        print(f"[baton] rank {rank} restore: skipped {skipped['name']} in the "
              f"{skipped['tier']} tier: {skipped['reason']}", flush=True)
    where = (f"{restored.name} from the {restored.tier} tier" if restored.path
             else "no checkpoint: step 0")
    bound = f"{not_after} or older" if not_after else f"a step before {before}"
    print(f"[baton] rank {rank} restore: the nodes agree on {bound}; using {where}", flush=True)
    return restored.path
