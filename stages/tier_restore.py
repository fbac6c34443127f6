"""`resume=latest` with checkpoint tiers: find the newest verified copy in any tier,
fastest first, before any worker starts (ckpt.tiers.restore), and record the choice."""
from __future__ import annotations

import json

from ckpt.layout import stage_dir
from ckpt.tiers.plan import TierPlan
from ckpt.tiers.restore import restore
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
