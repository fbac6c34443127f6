"""Tier plan, keeper protocol, URL tier and restore fall-through, without training.

A checkpoint here is a small directory committed with baton's own manifest code, so
every check (sizes, chunk hashes) is the real one restore runs."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from ckpt import content_hash, manifest as manifest_io
from ckpt.layout import LATEST, read_latest
from ckpt.tiers import keeper as keeper_mod
from ckpt.tiers.local_copy import copy_committed
from ckpt.tiers.peer import PeerClient, PeerUnavailable
from ckpt.tiers.plan import TierPlan
from ckpt.tiers.remote import committed, upload
from ckpt.tiers.restore import holdings, restore
from core.config.tiers_check import tier_problems
from core.config.tiers_schema import TiersConfig


REQUIRED = ("model", "optimizer", "scheduler", "rng", "data", "progress", "meta")


def _checkpoint(root: Path, step: int, payload: bytes = b"weights") -> Path:
    """A committed step directory with one data file and a real manifest."""
    directory = root / f"step-{step:06d}"
    directory.mkdir(parents=True)
    (directory / "data.json").write_bytes(payload + str(step).encode())
    hashing = content_hash.scheme(content_hash.CHUNK_BYTES, "sha256")
    files = {"data.json": content_hash.hash_file(directory / "data.json", hashing)}
    manifest_io.write(directory, manifest_io.Manifest(
        stage="cpt", step=step, components={c: ["data.json"] for c in REQUIRED}, files=files,
        parallel={"world_size": 1, "zero_stage": 0}, mid_accumulation=False, hashing=hashing))
    (root / LATEST).write_text(directory.name)
    return directory


@pytest.fixture
def keeper():
    server = keeper_mod.KeeperServer("127.0.0.1", 0, max_bytes=4096, token=None)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield server, "%s:%d" % server.server_address[:2]
    server.shutdown()
    server.server_close()
    thread.join()


def _plan(tmp_path, **kw) -> TierPlan:
    return TierPlan(tmp_path / "run", "cpt", 0, save_every=10, keep_last=3,
                    memory_dir=str(tmp_path / "shm"), **kw)


def test_due_tiers_follow_each_interval_and_the_last_step_reaches_the_run_directory(tmp_path):
    plan = _plan(tmp_path, memory_every=1, peer_every=5, peer_endpoint="h:1",
                 remote_url="file:///x")
    assert plan.due(3) == ["memory"]
    assert plan.due(5) == ["memory", "peer"]
    assert plan.due(10) == ["memory", "peer", "persistent", "remote"]
    assert plan.due(7, final=True) == ["memory", "persistent", "remote"]
    assert not _plan(tmp_path).enabled and plan.enabled
    assert plan.memory_root() != _plan(tmp_path / "other").memory_root()  # keyed by run dir


def test_tier_config_problems_name_the_key_value_and_fix(tmp_path):
    tiers = TiersConfig()
    tiers.peer.every, tiers.memory.every, tiers.persistent.url = 3, 2, "/no/scheme"
    found = "\n".join(tier_problems(tiers, save_every=4))
    assert "ckpt.tiers.peer.endpoint=None: expected host:port" in found
    assert "ckpt.tiers.peer.every=3: each peer copy is sent from" in found
    assert "ckpt.tiers.persistent.url='/no/scheme': expected an fsspec URL" in found
    tiers = TiersConfig()
    tiers.memory.every, tiers.peer.every, tiers.peer.endpoint = 1, 4, "127.0.0.1:9"
    assert tier_problems(tiers, save_every=50) == []


def test_keeper_lists_a_copy_only_once_committed_and_keeps_the_newest(keeper, tmp_path):
    _, endpoint = keeper
    root = tmp_path / "ckpts"
    with PeerClient(endpoint, 5) as client:
        for step in (2, 4, 6):
            client.send_checkpoint("run/cpt/node-0", _checkpoint(root, step), keep=2)
        client.request({"op": "put", "scope": "run/cpt/node-0", "name": "step-000008",
                        "rel": "data.json"}, b"half a save")  # never committed
        held = client.committed("run/cpt/node-0")
        assert list(held) == ["step-000004", "step-000006"]
        assert set(held["step-000006"]) == {"data.json", "manifest.json"}
        client.fetch("run/cpt/node-0", "step-000006", sorted(held["step-000006"]),
                     tmp_path / "back")
    manifest_io.verify(tmp_path / "back")  # every byte came back


def test_a_full_keeper_refuses_with_the_sizes_and_the_fix(keeper, tmp_path):
    _, endpoint = keeper
    big = _checkpoint(tmp_path / "ckpts", 1, payload=b"x" * 5000)
    with PeerClient(endpoint, 5) as client, pytest.raises(PeerUnavailable) as caught:
        client.send_checkpoint("s", big, keep=1)
    assert "keeper full" in str(caught.value) and "--max-bytes" in str(caught.value)


def test_a_keeper_with_a_token_refuses_requests_without_it(tmp_path, monkeypatch):
    server = keeper_mod.KeeperServer("127.0.0.1", 0, 0, token="s3cret")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        endpoint = "%s:%d" % server.server_address[:2]
        with PeerClient(endpoint, 5) as client, pytest.raises(PeerUnavailable, match="token"):
            client.ping()
        monkeypatch.setenv(keeper_mod.TOKEN_ENV, "s3cret")
        with PeerClient(endpoint, 5) as client:
            assert client.ping()["ok"]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_url_tier_commits_manifest_last_and_keeps_the_newest(tmp_path):
    url = f"file://{tmp_path / 'bucket'}"
    source = tmp_path / "ckpts"
    for step in (1, 2, 3):
        upload(_checkpoint(source, step), url, keep=2)
    assert committed(url) == ["step-000002", "step-000003"]
    (tmp_path / "bucket" / "step-000009").mkdir()  # files without a manifest: not a checkpoint
    assert committed(url)[-1] == "step-000003"
    assert (tmp_path / "bucket" / LATEST).read_text() == "step-000003"


def test_restore_prefers_newest_then_fastest_and_falls_through_bad_copies(keeper, tmp_path):
    _, endpoint = keeper
    plan = _plan(tmp_path, memory_every=1, peer_every=2, peer_endpoint=endpoint,
                 remote_url=f"file://{tmp_path / 'bucket'}")
    run_root = plan.persistent_root()
    for step in (2, 4):
        source = _checkpoint(run_root, step)
        copy_committed(source, plan.memory_root(), keep=2)
        with PeerClient(endpoint, 5) as client:
            client.send_checkpoint(plan.peer_scope(), source, keep=2)
        upload(source, plan.remote_root(), keep=2)
    assert holdings(plan, [])[:4] == [("memory", "step-000004"), ("peer", "step-000004"),
                                      ("persistent", "step-000004"), ("remote", "step-000004")]
    assert restore(plan, tmp_path / "restored").tier == "memory"

    (plan.memory_root() / "step-000004" / "data.json").write_bytes(b"weightz4")  # same size
    restored = restore(plan, tmp_path / "restored")
    assert (restored.tier, restored.name) == ("peer", "step-000004")
    assert "checksum mismatch in data.json" in restored.fell_through[0]["reason"]
    assert json.loads(json.dumps(restored.to_dict()))["path"].startswith(str(tmp_path / "restored"))

    (run_root / "step-000004" / "data.json").unlink()
    plan_no_peer = _plan(tmp_path, memory_every=1, peer_every=2, peer_endpoint="127.0.0.1:1",
                         remote_url=plan.remote_url)
    restored = restore(plan_no_peer, tmp_path / "restored")
    assert (restored.tier, restored.name) == ("remote", "step-000004")
    assert [f["tier"] for f in restored.fell_through] == ["peer", "memory", "persistent"]
    assert read_latest(plan.memory_root()).name == "step-000004"  # restore changes nothing


def test_nothing_anywhere_restores_nothing(tmp_path):
    plan = _plan(tmp_path, memory_every=1)
    restored = restore(plan, tmp_path / "restored")
    assert restored.path is None and restored.fell_through == []


def test_a_full_keeper_or_an_unreachable_url_is_a_recorded_fall_through(keeper, tmp_path):
    from ckpt.tiers.replicate import replicate

    _, endpoint = keeper  # holds at most 4096 bytes
    plan = _plan(tmp_path, memory_every=1, peer_every=1, peer_endpoint=endpoint,
                 remote_url="nosuchprotocol://bucket/prefix")
    final = _checkpoint(plan.persistent_root(), 1, payload=b"x" * 5000)
    placement = replicate(plan, final, ["memory", "peer", "persistent", "remote"], "persistent")
    assert placement["persistent"]["ok"] and placement["memory"]["ok"]
    assert not placement["peer"]["ok"] and "keeper full" in placement["peer"]["error"]
    assert not placement["remote"]["ok"] and "nosuchprotocol" in placement["remote"]["error"]
    assert manifest_io.verify(plan.memory_root() / final.name)  # the copy that worked is whole
    fell = []
    assert ("remote", "step-000001") not in holdings(plan, fell)
    assert [f["tier"] for f in fell] == ["remote"]  # listed once as unreachable, not fatal
