"""Checkpoint tiers end to end: saves in node memory, on a peer keeper and in the run
directory; a crash, then `resume=latest` restores from the fastest tier holding a
verified copy of the newest checkpoint, falls through a wiped, killed or corrupt tier,
and the resumed run ends bit for bit where an uninterrupted run ends."""
from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ckpt.tiers.plan import TierPlan
from core.config import compose
from tests.conftest import metrics, run_baton
from tests.keeper_process import KeeperProcess

pytestmark = pytest.mark.slow
STEPS, CRASH_AT = 6, 5
COMMON = [f"stage.max_steps={STEPS}", "stage.save_every=3", "stage.eval_every=3",
          "ckpt.tiers.memory.every=1", "ckpt.tiers.peer.every=2"]
FINAL = f"cpt/checkpoints/step-{STEPS:06d}"


def _tiered(run_dir: Path, keeper: KeeperProcess) -> list[str]:
    return [f"run.dir={run_dir}", *COMMON, f"ckpt.tiers.peer.endpoint={keeper.endpoint}"]


def _memory_root(run_dir: Path) -> Path:
    cfg = compose(["stage=cpt", f"run.dir={run_dir}", *COMMON[:4]])  # the memory tier's place
    return TierPlan.from_config(cfg).memory_root()


def _crash(run_dir: Path, keeper: KeeperProcess):
    """Saves 1-4 land (memory 3,4; peer 2,4; run directory 3); rank 0 dies in save 5."""
    crashed = run_baton("stage", "cpt", *_tiered(run_dir, keeper),
                        f"debug.crash_in_save_at_step={CRASH_AT}")
    assert crashed.returncode != 0, crashed.stdout[-2000:]
    return crashed


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The uninterrupted reference plus one crashed tiered run per scenario (own keeper
    each, so killing one keeper touches no other scenario), two at a time."""
    root = tmp_path_factory.mktemp("tiers")
    keepers: dict[str, KeeperProcess] = {}
    try:
        for name in ("memory", "peer", "persistent", "corrupt"):
            keepers[name] = KeeperProcess()
        with ThreadPoolExecutor(2) as pool:
            straight = pool.submit(run_baton, "stage", "cpt", f"run.dir={root / 'straight'}",
                                   *COMMON[:3], check=True)
            crashed = [pool.submit(_crash, root / name, keeper) for name, keeper in keepers.items()]
            for future in [straight, *crashed]:
                future.result()
        yield root, keepers
    finally:
        for name, keeper in keepers.items():
            keeper.stop()
            shutil.rmtree(_memory_root(root / name).parents[2], ignore_errors=True)
        assert not any(k.alive for k in keepers.values())


def _restart(root: Path, name: str, keeper: KeeperProcess):
    run_dir = root / name
    restarted = run_baton("stage", "cpt", *_tiered(run_dir, keeper), "resume=latest", check=True)
    record = json.loads((run_dir / "cpt" / "restore.json").read_text())
    diff = run_baton("ckpt", "diff", str(root / "straight" / FINAL), str(run_dir / FINAL))
    assert diff.returncode == 0 and "IDENTICAL" in diff.stdout, diff.stdout + diff.stderr
    straight, resumed = metrics(root / "straight", "cpt"), metrics(run_dir, "cpt")
    for step in range(5, STEPS + 1):
        assert resumed[step]["loss"] == straight[step]["loss"], f"loss differs at step {step}"
    return restarted, record


def test_the_crash_left_each_tier_its_copies(runs):
    root, keepers = runs
    run_dir = root / "memory"
    listing = run_baton("ckpt", "tiers", "cpt", *_tiered(run_dir, keepers["memory"]), "--json",
                        check=True)
    copies = {(c["tier"], c["name"]) for c in json.loads(listing.stdout)["copies"]}
    assert copies == {("memory", "step-000003"), ("memory", "step-000004"),
                      ("peer", "step-000002"), ("peer", "step-000004"),
                      ("persistent", "step-000003")}
    assert (_memory_root(run_dir) / "step-000005.tmp").is_dir()  # the killed save's, never loaded


def test_restore_uses_the_memory_tier_first(runs):
    root, keepers = runs
    restarted, record = _restart(root, "memory", keepers["memory"])
    assert (record["tier"], record["name"]) == ("memory", "step-000004")
    assert record["fell_through"] == []
    assert "restore: step-000004 from the memory tier" in restarted.stdout
    assert sorted(metrics(root / "memory", "cpt")) == list(range(1, STEPS + 1))


def test_memory_wiped_restores_from_the_peer(runs):
    root, keepers = runs
    shutil.rmtree(_memory_root(root / "peer").parent.parent)  # node restart: tmpfs empty
    restarted, record = _restart(root, "peer", keepers["peer"])
    assert (record["tier"], record["name"]) == ("peer", "step-000004")
    assert Path(record["path"]).is_relative_to(root / "peer" / "cpt" / "restored")


def test_memory_wiped_and_peer_killed_restores_from_the_run_directory(runs):
    root, keepers = runs
    shutil.rmtree(_memory_root(root / "persistent").parent.parent)
    keepers["persistent"].stop()
    restarted, record = _restart(root, "persistent", keepers["persistent"])
    assert (record["tier"], record["name"]) == ("persistent", "step-000003")
    assert [f["tier"] for f in record["fell_through"]] == ["peer"]  # unreachable, recorded
    assert "skipped the peer tier" in restarted.stdout
    # The resumed run's saves found no keeper: recorded per checkpoint, the run completed.
    result = json.loads((root / "persistent" / "cpt" / "result.json").read_text())
    final = result["checkpoints"][-1]
    assert final["placement"]["peer"]["ok"] is False
    assert final["placement"]["memory"]["ok"] is True
    _lineage_and_mlflow_record_the_locations(root / "persistent", result)


def _lineage_and_mlflow_record_the_locations(run_dir: Path, result: dict) -> None:
    """What the pipeline records for a stage's checkpoints (flows.recording), on the real
    lineage store and MLflow store of the run directory."""
    from flows.recording import Recording

    cfg = compose(["stage=cpt", f"run.dir={run_dir}", *COMMON[:4]])
    recording = Recording(cfg)
    pipeline = recording.start_pipeline(None)
    stage_run = recording.start_stage(pipeline.id, "cpt", {"world_size": 1})
    (recorded,) = [c for c in recording.stage_outputs(stage_run, run_dir, result["checkpoints"])
                   if c.step == STEPS]
    stored = next(c for c in recording.store.checkpoints(stage_run.id) if c.step == STEPS)
    assert stored.locations == recorded.locations == result["checkpoints"][-1]["placement"]
    model_id = recording.mlflow.model_id_for_checkpoint(stored.id)
    tags = recording.mlflow.client.get_logged_model(model_id).tags
    assert tags["baton.tier.memory"].endswith(f"step-{STEPS:06d}")
    assert tags["baton.tier.peer"].startswith("failed: peer keeper")


def test_a_corrupt_copy_is_skipped_for_the_next_tier(runs):
    root, keepers = runs
    copy = _memory_root(root / "corrupt") / "step-000004"
    target = max((p for p in copy.rglob("*.pt")), key=lambda p: p.stat().st_size)
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    restarted, record = _restart(root, "corrupt", keepers["corrupt"])
    assert (record["tier"], record["name"]) == ("peer", "step-000004")
    (skipped,) = record["fell_through"]
    assert (skipped["tier"], skipped["name"]) == ("memory", "step-000004")
    assert "checksum mismatch" in skipped["reason"] and target.name in skipped["reason"]
