"""`baton ckpt gc [PATH] [run.dir=...]`: remove what interrupted saves and deletions left.

PATH is a stage's checkpoints directory (or the stage directory above it); without it,
every stage under run.dir, pipeline runs included. Each is cleaned while holding that
stage's lock (stages.run_lock): a running save's `step-N.tmp` looks just like a dead
one's, so gc refuses a stage that is running. What counts as a leftover: ckpt.cleanup.
"""
from __future__ import annotations

from pathlib import Path

from ckpt.errors import CheckpointError

CHECKPOINTS = "checkpoints"
STAGE_NAMES = ("cpt", "sft", "rm", "rl")
WHILE_RUNNING = ("`baton ckpt gc` removed nothing there: a running save's step-N.tmp looks "
                 "just like a dead one's. Wait for that run to finish or {stop}, then run gc "
                 "again.")


class NotACheckpointsDirectory(CheckpointError):
    """PATH is not `<run.dir>/<stage>/checkpoints` nor the stage directory above it."""

    def __init__(self, path, found: str):
        super().__init__(path, f"{found}; `baton ckpt gc` takes a stage's checkpoints directory "
                         "(<run.dir>/<stage>/checkpoints, or <run.dir>/<stage>), or no path and "
                         "run.dir=... for every stage of a run directory")


def add_gc_arguments(sub) -> None:
    gc = sub.add_parser("gc", help="remove leftovers of interrupted saves (step-N.tmp, "
                        "step-N.deleting, step directories without a manifest)")
    gc.add_argument("path", nargs="?", default=None,
                    help="a stage's checkpoints directory; default: every stage under run.dir")


def checkpoints_roots(path: str | None, overrides: list[str]) -> list[Path]:
    if path is None:
        from core.config import compose
        run_dir = Path(compose(overrides).run.dir)
        homes = [run_dir, *sorted(run_dir.glob("pipeline-*"))]
        return [home / stage / CHECKPOINTS for home in homes for stage in STAGE_NAMES
                if (home / stage / CHECKPOINTS).is_dir()]
    if not path.strip():
        raise NotACheckpointsDirectory(repr(path), "an empty path")
    given = Path(path).resolve()
    if (given / CHECKPOINTS).is_dir():
        return [given / CHECKPOINTS]
    if given.name == CHECKPOINTS and given.is_dir():
        return [given]
    found = "not a stage's checkpoints directory" if given.exists() else "no such directory"
    raise NotACheckpointsDirectory(given, found)


def run_gc(args) -> int:
    from ckpt.cleanup import remove_leftovers
    from ckpt.layout import committed_steps, read_latest
    from stages.run_lock import stage_lock

    roots = checkpoints_roots(args.path, args.overrides)
    if not roots:
        print("[baton] gc: no checkpoints directory under run.dir; nothing to do")
    for root in roots:
        with stage_lock(root.parent, refused=WHILE_RUNNING):
            removed = remove_leftovers(root)
        for leftover in removed:
            print(f"removed {leftover.path}: {leftover.why}")
        latest = read_latest(root)
        print(f"[baton] gc {root}: removed {len(removed)} leftover(s); kept "
              f"{len(committed_steps(root))} committed checkpoint(s), latest -> "
              f"{latest.name if latest else 'none'}")
    return 0
