"""Node copies (the memory tier across nodes) on the restore side, without training: which
copies a rank may use, the keeper's per-node names, and the names of fetched copies.
The two-node run itself is tests/integration/stages/test_two_nodes.py."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from ckpt import content_hash, manifest as manifest_io
from ckpt.layout import LATEST
from ckpt.node_copies import NODE, NodeGroup, served_ranks, serves
from ckpt.tiers import keeper as keeper_mod
from ckpt.tiers.peer import PeerClient
from ckpt.tiers.plan import TierPlan
from ckpt.tiers.restore import checkpoint_name, holdings, restore

REQUIRED = ("model", "optimizer", "scheduler", "rng", "data", "progress", "meta")


def _copy(root: Path, step: int, ranks: list[int] | None) -> Path:
    """A committed step directory; `ranks`: a node copy serving these ranks (None: whole)."""
    directory = root / f"step-{step:06d}"
    directory.mkdir(parents=True)
    (directory / "data.json").write_bytes(b"state %d" % step)
    hashing = content_hash.scheme(content_hash.CHUNK_BYTES, "sha256")
    extra = {NODE: {"index": ranks[0] // 2, "ranks": ranks}} if ranks is not None else {}
    manifest_io.write(directory, manifest_io.Manifest(
        stage="cpt", step=step, components={c: ["data.json"] for c in REQUIRED},
        files={"data.json": content_hash.hash_file(directory / "data.json", hashing)},
        parallel={"world_size": 4, "zero_stage": 0}, hashing=hashing, extra=extra))
    (root / LATEST).write_text(directory.name)
    return directory


def _plan(tmp_path, node: int, **kw) -> TierPlan:
    return TierPlan(tmp_path / "run", "cpt", node, save_every=10, keep_last=3,
                    memory_dir=str(tmp_path / "shm"), memory_every=1, nodes=2, **kw)


@pytest.fixture
def keeper():
    server = keeper_mod.KeeperServer("127.0.0.1", 0, max_bytes=0, token=None)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield "%s:%d" % server.server_address[:2]
    server.shutdown()
    server.server_close()
    thread.join()


def test_a_node_copy_serves_only_the_ranks_it_names():
    assert serves({}, 3) and served_ranks({}) is None
    node = {NODE: {"index": 1, "ranks": [2, 3]}}
    assert serves(node, 3) and not serves(node, 0) and served_ranks(node) == [2, 3]
    alone = NodeGroup.gather(node_rank=0, nodes=1, world=2)  # one node: no collective
    assert (alone.index, alone.ranks, alone.leader) == (0, (0, 1), 0)
    assert NodeGroup(1, (2, 3), 2).record() == {"index": 1, "ranks": [2, 3]}


def test_each_node_restores_from_its_own_memory_directory(tmp_path):
    plans = [_plan(tmp_path, k) for k in (0, 1)]
    assert plans[0].memory_root() != plans[1].memory_root()
    _copy(plans[0].memory_root(), 3, [0, 1])
    _copy(plans[1].memory_root(), 2, [2, 3])
    assert restore(plans[1], tmp_path / "staging").name == "step-000002"
    assert restore(plans[0], tmp_path / "staging").name == "step-000003"


def test_a_rank_skips_a_copy_of_other_ranks_and_stays_at_or_below_the_agreed_step(tmp_path):
    plan = _plan(tmp_path, 0)
    for step in (1, 2, 3):
        _copy(plan.memory_root(), step, [0, 1])
    _copy(plan.persistent_root(), 2, None)
    restored = restore(plan, tmp_path / "staging", rank=1, not_after="step-000002")
    assert (restored.tier, restored.name) == ("memory", "step-000002")
    # Rank 2's files are on the other node: this node's copies are refused, with the
    # reason, and the whole checkpoint in the shared run directory serves it.
    restored = restore(plan, tmp_path / "staging", rank=2)
    assert (restored.tier, restored.name) == ("persistent", "step-000002")
    assert restored.fell_through[0] == {
        "tier": "memory", "name": "step-000003",
        "reason": "a copy of node 0's ranks [0, 1], not of rank 2"}
    assert restore(plan, tmp_path / "staging", rank=2, not_after="step-000001").path is None


def test_the_keeper_holds_each_nodes_copies_under_its_own_name(tmp_path, keeper):
    plans = [_plan(tmp_path, k, peer_every=1, peer_endpoint=keeper) for k in (0, 1)]
    assert plans[1].peer_scope(node_copy=True) == plans[1].peer_scope() + "/node-1"
    with PeerClient(keeper, 5) as client:
        client.send_checkpoint(plans[0].peer_scope(node_copy=True),
                               _copy(tmp_path / "n0", 4, [0, 1]), keep=2)
        client.send_checkpoint(plans[1].peer_scope(node_copy=True),
                               _copy(tmp_path / "n1", 4, [2, 3]), keep=2)
        client.send_checkpoint(plans[0].peer_scope(), _copy(tmp_path / "whole", 2, None), keep=2)
    # Node 1 sees its own copy and the whole checkpoints, never node 0's copy.
    assert [c for c in holdings(plans[1], []) if c[0] == "peer"] == [
        ("peer", "step-000004"), ("peer", "step-000002")]
    restored = restore(plans[1], tmp_path / "staging", rank=3)
    assert (restored.tier, restored.name) == ("peer", "step-000004")
    assert checkpoint_name(restored.path) == "step-000004" != restored.path.name
    assert manifest_io.read(restored.path).extra[NODE]["ranks"] == [2, 3]


def test_a_node_copy_is_refused_by_reshard_in_words(tmp_path):
    from ckpt.errors import ReshardUnsupported
    from ckpt.parallel_layout import Sharding
    from handoff.reshard import _refuse_early

    copy = _copy(tmp_path / "shm", 3, [2, 3])
    manifest = manifest_io.read(copy)
    with pytest.raises(ReshardUnsupported, match=r"node 1's memory-tier copy, holding the files "
                       r"of ranks \[2, 3\] only"):
        _refuse_early(copy, tmp_path / "out", manifest, Sharding(4, 0), Sharding(2, 0))
    whole = _copy(tmp_path / "run", 3, None)  # a whole checkpoint passes this check
    _refuse_early(whole, tmp_path / "out", manifest_io.read(whole), Sharding(4, 0), Sharding(2, 0))
