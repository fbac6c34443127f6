"""One `baton bench ckpt --tiers`: how long a resume waits for its checkpoint from each
tier (memory, peer, persistent, remote), and what placing a copy there costs
(docs/bench.md, "Tier restore").

One real checkpoint is saved once (baton's Checkpointer, sync, on the bench's sized
state); the DeepSpeed engine is then released and only files move: every round copies
that checkpoint into each tier as training does, and restores it from each tier alone.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from bench.console import gb, progress, quiet_libraries, stdout_to_stderr
from bench.keeper_process import KeeperProcess
from bench.machine import filesystem, machine_info
from bench.tiers_options import TierBenchOptions
from bench.tiers_rounds import run_rounds
from bench.tiers_sites import TierSites
from bench.tiers_summary import summarize


def run_tier_bench(options: TierBenchOptions) -> dict:
    options.check()
    quiet_libraries()
    # Absolute: the remote tier is a file:// URL of it, and run keys hash the resolved path.
    workdir = Path(tempfile.mkdtemp(prefix="baton-bench-tiers-", dir=options.workdir)).resolve()
    keeper = sites = None
    try:
        saved = save_once(options, workdir)
        progress("starting a peer keeper (`baton ckpt keeper` on 127.0.0.1)")
        keeper = KeeperProcess()
        sites = TierSites(workdir, saved["stage"], keeper.endpoint, saved["memory_dir"])
        times = run_rounds(sites, saved["path"], options.rounds)
        rows, ratios = summarize(times)
        machine = {**machine_info(workdir),
                   "memory_tier_filesystem": filesystem(Path(saved["memory_dir"]))}
        return {
            "state_bytes": saved["state_bytes"], "checkpoint_bytes": saved["checkpoint_bytes"],
            "checkpoint": saved["path"].name, "files": saved["files"], "params": saved["params"],
            "model": saved["model"], "save_s": saved["save_s"], "rounds": options.rounds,
            "tiers": rows, "ratios": ratios, "machine": machine,
            "memory_run_dir": str(sites.memory_run_dir), "run_key": sites.memory_run_dir.name,
            "keeper": {"pid": keeper.pid, "endpoint": keeper.endpoint},
            "settings": {"size_gb": options.size_gb, "rounds": options.rounds,
                         "overrides": list(options.overrides)},
        }
    finally:
        if sites is not None:
            sites.remove_memory_copies()
        if keeper is not None:
            keeper.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def save_once(options: TierBenchOptions, workdir: Path) -> dict:
    """The checkpoint every tier gets a copy of: `baton sync` of the bench's sized state,
    verified, after which the state (model, optimizer, engine) is released."""
    from ckpt.manifest import verify

    from bench.methods.base import tree_bytes
    from bench.methods.baton_checkpointer import BatonSave
    from bench.run import sized_state

    state, shape = sized_state(options.size_gb, options.as_bench_options(), workdir)
    method = BatonSave("sync")
    try:
        stage, memory_dir = state.cfg.stage.name, state.cfg.ckpt.tiers.memory.dir
        with stdout_to_stderr():  # DeepSpeed prints each file it saves
            method.prepare(state, workdir / "saved" / stage / "checkpoints")
            started = time.perf_counter()
            method.save()
            method.wait_durable()
            save_s = time.perf_counter() - started
        manifest = verify(method.last)
        saved = {"path": method.last, "stage": stage, "memory_dir": memory_dir,
                 "state_bytes": state.nbytes(), "params": state.params(), "model": shape,
                 "checkpoint_bytes": tree_bytes(method.last), "files": len(manifest.files),
                 "save_s": save_s}
    finally:
        method.close()
        state.close()
    progress(f"saved {saved['path'].name}: {saved['files']} files, "
             f"{gb(saved['checkpoint_bytes'])} in {save_s:.3f} s; the engine is released")
    return saved
