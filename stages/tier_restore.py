"""`resume=latest` with checkpoint tiers: find the newest verified copy in any tier,
fastest first, before any worker starts (ckpt.tiers.restore), and record the choice;
across nodes, the workers then agree on one checkpoint every rank can load."""
from __future__ import annotations

import json
from pathlib import Path

from ckpt.layout import position_of, stage_dir
from ckpt.tiers.plan import TierPlan
from ckpt.tiers.restore import checkpoint_name, restore
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
    copy serves only its own ranks. Every rank offers the newest checkpoint it can load;
    while the offers differ, every rank asks again for the oldest one offered or older,
    until all agree (at worst on none: step 0). Collective: every rank calls it."""
    import torch.distributed as dist

    from ckpt.manifest import read as read_manifest
    from ckpt.node_copies import serves

    plan = TierPlan.from_config(cfg)
    staging = stage_dir(cfg.run.dir, cfg.stage.name) / f"restored-rank-{rank}"
    offer = Path(path) if path else None
    if offer is not None and not serves(read_manifest(offer).extra, rank):
        offer = _again(plan, staging, rank, checkpoint_name(offer))
    while True:
        offers: list[str | None] = [None] * world
        name = checkpoint_name(offer) if offer is not None else None
        dist.all_gather_object(offers, name)
        if len(set(offers)) == 1:
            return str(offer) if offer is not None else None
        target = min(offers, key=lambda n: position_of(n) if n else (-1, -1))
        if name != target:
            offer = _again(plan, staging, rank, target) if target else None


def _again(plan: TierPlan, staging: Path, rank: int, not_after: str) -> Path | None:
    restored = restore(plan, staging, rank=rank, not_after=not_after)
    for skipped in restored.fell_through:
        print(f"[baton] rank {rank} restore: skipped {skipped['name']} in the "
              f"{skipped['tier']} tier: {skipped['reason']}", flush=True)
    where = (f"{restored.name} from the {restored.tier} tier" if restored.path
             else "no checkpoint: step 0")
    print(f"[baton] rank {rank} restore: the nodes agree on {not_after} or older; "
          f"using {where}", flush=True)
    return restored.path
