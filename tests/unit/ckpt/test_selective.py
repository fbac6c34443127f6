"""Selective persistence without training: which layers a save writes, the skeleton and
its assembly, manifests that reference earlier checkpoints, and retention."""
from __future__ import annotations

import io
import json
from collections import OrderedDict

import pytest
import torch

from ckpt import commit as commit_io
from ckpt import content_hash, manifest as manifest_io
from ckpt.errors import CorruptCheckpoint, UnconfinedPath
from ckpt.layout import LATEST
from ckpt.selective import SelectivePolicy, assemble, group_of

NAMES = ["model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight",
         "model.layers.1.mlp.up_proj.weight", "lm_head.weight"]


def _state(scale: dict[str, float] | None = None) -> dict:
    torch.manual_seed(0)
    module = OrderedDict((n, torch.randn(4, 3) * (scale or {}).get(n, 1.0)) for n in NAMES)
    moments = {i: {"step": torch.tensor(3.0), "exp_avg": torch.randn(4, 3),
                   "exp_avg_sq": torch.rand(4, 3)} for i in range(len(NAMES))}
    return {"module": module, "optimizer": {"state": moments, "param_groups": [
        {"lr": 1e-3, "params": list(range(len(NAMES)))}]}, "lr_scheduler": {"last_epoch": 3}}


def test_groups_are_layers_and_top_level_modules():
    assert [group_of(n) for n in NAMES] == ["embed_tokens", "layers.0", "layers.1", "lm_head"]


def test_split_then_assemble_gives_back_the_same_state():
    policy = SelectivePolicy(0.0, 10, NAMES)
    state = _state()
    skeleton, groups = policy.split(state)
    assert "module" not in skeleton and skeleton["optimizer"]["state"] == {}
    files = {f"layers/{g}.pt": parts for g, parts in groups.items()}
    back = assemble(skeleton, files.__getitem__)
    assert list(back["module"]) == NAMES
    assert all(torch.equal(back["module"][n], state["module"][n]) for n in NAMES)
    assert back["optimizer"]["state"].keys() == state["optimizer"]["state"].keys()
    assert back["lr_scheduler"] == state["lr_scheduler"]


def test_only_groups_past_the_threshold_are_written_and_every_kth_save_is_full():
    policy = SelectivePolicy(0.05, 3, NAMES)
    first = policy.decide(policy.split(_state())[1], "step-000001")
    assert first == {} and policy.last_decision["full"]
    # layers.0 moves by 10% (written), the rest by 1% (referenced to step 1).
    moved = policy.split(_state({NAMES[1]: 1.10, NAMES[0]: 1.01, NAMES[2]: 1.01}))[1]
    refs = policy.decide(moved, "step-000002")
    assert refs == {"layers/embed_tokens.pt": "step-000001", "layers/layers.1.pt": "step-000001",
                    "layers/lm_head.pt": "step-000001"}
    refs = policy.decide(moved, "step-000003")  # unchanged since step 2's layers.0
    assert refs["layers/layers.0.pt"] == "step-000002"
    assert policy.decide(moved, "step-000004") == {}  # the 4th save: full
    assert policy.last_decision["full"]


def test_threshold_zero_writes_every_group_that_changed_at_all():
    policy = SelectivePolicy(0.0, 100, NAMES)
    policy.decide(policy.split(_state())[1], "step-000001")
    refs = policy.decide(policy.split(_state({NAMES[3]: 1.0 + 1e-6}))[1], "step-000002")
    assert "layers/lm_head.pt" not in refs and len(refs) == 3  # unchanged ones: stored once


def _pt(value: float) -> bytes:
    """A real layer file (a torch.save archive: verify scans every pickle it names)."""
    buffer = io.BytesIO()
    torch.save({"module": {"w": torch.full((3,), value)}, "optimizer_state": {}}, buffer)
    return buffer.getvalue()


def _checkpoint(root, step, files: dict[str, bytes], references: dict | None = None):
    directory = root / f"step-{step:06d}"
    directory.mkdir(parents=True)
    hashing = content_hash.scheme(content_hash.CHUNK_BYTES, "sha256")
    entries = {}
    for rel, data in files.items():
        (directory / rel).parent.mkdir(parents=True, exist_ok=True)
        (directory / rel).write_bytes(data)
        entries[rel] = content_hash.hash_file(directory / rel, hashing)
    components = {c: list(files) for c in manifest_io.REQUIRED}
    manifest_io.write(directory, manifest_io.Manifest(
        "cpt", step, components, entries, {"world_size": 1, "zero_stage": 0},
        hashing=hashing, references=references or {}))
    (root / LATEST).write_text(directory.name)
    return directory, entries


def test_a_reference_is_checked_like_a_local_file(tmp_path):
    first, entries = _checkpoint(tmp_path, 1, {"a.json": b"{}", "layers/l0.pt": _pt(1.0)})
    ref = {"layers/l0.pt": {"checkpoint": first.name, **entries["layers/l0.pt"]}}
    second, _ = _checkpoint(tmp_path, 2, {"a.json": b"{}"}, ref)
    assert manifest_io.verify(second).references == ref
    assert json.loads((first / "manifest.json").read_text()).get("references") is None

    (first / "layers/l0.pt").write_bytes(_pt(2.0))  # same size, other bytes
    with pytest.raises(CorruptCheckpoint, match="checksum mismatch in layers/l0.pt"):
        manifest_io.verify(second)
    (first / "layers/l0.pt").unlink()
    with pytest.raises(CorruptCheckpoint, match="missing file layers/l0.pt, referenced in step-000001"):
        manifest_io.verify(second)


@pytest.mark.parametrize("name,rel", [("../elsewhere", "x.pt"), ("step-000001", "../../etc/x"),
                                       ("notastep", "x.pt")])
def test_a_reference_outside_the_sibling_checkpoints_is_refused(tmp_path, name, rel):
    second, _ = _checkpoint(tmp_path, 2, {"a.json": b"{}"},
                            {rel: {"checkpoint": name, "size": 1, "sha256": "0" * 64}})
    with pytest.raises(UnconfinedPath):
        manifest_io.read(second)


def test_retention_never_deletes_a_referenced_checkpoint(tmp_path):
    first, entries = _checkpoint(tmp_path, 1, {"a.json": b"{}", "layers/l0.pt": _pt(0.0)})
    ref = {"layers/l0.pt": {"checkpoint": first.name, **entries["layers/l0.pt"]}}
    for step in (2, 3, 4):
        _checkpoint(tmp_path, step, {"a.json": b"{}"}, ref)
    removed = commit_io.apply_retention(tmp_path, keep_last=2)
    assert [p.name for p in removed] == ["step-000002"]
    assert first.is_dir() and manifest_io.verify(tmp_path / "step-000004")


@pytest.mark.parametrize("signed", [False, True])
def test_a_tier_copy_of_a_selective_checkpoint_carries_what_it_references(tmp_path, monkeypatch,
                                                                         signed):
    import threading

    from ckpt import signing
    from ckpt.content_digest import content_digest
    from ckpt.tiers import keeper as keeper_mod
    from ckpt.tiers.local_copy import copy_committed
    from ckpt.tiers.peer import PeerClient
    from ckpt.tiers.remote import fetch, upload

    if signed:
        monkeypatch.setenv("BATON_TEST_SIGNING_KEY", "k" * 32)
        signing.configure("BATON_TEST_SIGNING_KEY")
    try:
        root = tmp_path / "run"
        first, entries = _checkpoint(root, 1, {"a.json": b"{}", "layers/l0.pt": _pt(1.0)})
        ref = {"layers/l0.pt": {"checkpoint": first.name, **entries["layers/l0.pt"]}}
        second, _ = _checkpoint(root, 2, {"a.json": b"{}"}, ref)
        digest = content_digest(manifest_io.verify(second))

        copies = [copy_committed(second, tmp_path / "memory", keep=1)]
        upload(second, f"file://{tmp_path / 'bucket'}", keep=1)
        fetch(f"file://{tmp_path / 'bucket'}", second.name, tmp_path / "fetched" / second.name)
        copies.append(tmp_path / "fetched" / second.name)
        server = keeper_mod.KeeperServer("127.0.0.1", 0, 0, None)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
        thread.start()
        try:
            with PeerClient("%s:%d" % server.server_address[:2], 5) as client:
                client.send_checkpoint("s", second, keep=1)
                held = client.committed("s")[second.name]
                client.fetch("s", second.name, sorted(held), tmp_path / "peer" / second.name)
        finally:
            server.shutdown()
            server.server_close()
            thread.join()
        copies.append(tmp_path / "peer" / second.name)
        for copy in copies:  # alone: no sibling step-000001 next to any of them
            manifest = manifest_io.verify(copy)
            assert manifest.references == {} and "layers/l0.pt" in manifest.files
            assert (copy / "layers/l0.pt").read_bytes() == _pt(1.0)
            assert content_digest(manifest) == digest
            assert not (copy.parent / first.name).exists()
    finally:
        signing.configure(None)
