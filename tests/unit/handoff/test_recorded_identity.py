"""What a handoff records about its input checkpoint, and how a re-run checks it: by content
digest (what the checkpoint holds), or by manifest sha256 for records written before
content digests (fast: a small checkpoint of JSON files, no DeepSpeed)."""
from __future__ import annotations

import json
from types import SimpleNamespace as NS

import pytest

from ckpt import commit, content_hash, manifest
from ckpt.content_digest import content_digest_of
from ckpt.layout import MANIFEST, step_dirname
from handoff.decide import prepare_input
from handoff.rerun import RerunNotPossible, recorded_input

SCHEME = content_hash.scheme()


def _checkpoint(root):
    tmp = commit.clear_stale_tmp(root, step_dirname(2))
    tmp.mkdir(parents=True)
    files = {}
    for comp in manifest.REQUIRED:
        (tmp / f"{comp}.json").write_text(json.dumps({comp: 1}))
        files[f"{comp}.json"] = content_hash.hash_file(tmp / f"{comp}.json", SCHEME)
    return commit.commit(tmp, manifest.Manifest(
        stage="sft", step=2, components={c: [f"{c}.json"] for c in manifest.REQUIRED},
        files=files, parallel={"world_size": 1, "zero_stage": 0, "micro_batch": 1,
                               "global_batch": 1}, hashing=SCHEME))


def _cfg():
    return NS(parallel=NS(world_size=1, zero_stage=0), stage=NS(micro_batch=1, global_batch=1))


def _rewrite_manifest(path, change) -> None:
    data = json.loads((path / MANIFEST).read_text())
    change(data)
    (path / MANIFEST).write_text(json.dumps(data))


def _handoff(chosen) -> NS:
    return NS(id=5, reshard=prepare_input(chosen, chosen.parent / "unused", _cfg(), _cfg()).reshard)


def test_a_same_layout_handoff_records_the_content_digest_beside_the_manifest_sha256(tmp_path):
    chosen = _checkpoint(tmp_path)
    record = _handoff(chosen).reshard
    digest = content_digest_of(chosen)
    assert record["input_content_digest"] == record["output_content_digest"] == digest
    assert record["input_manifest_sha256"] == manifest.checksum_of(chosen / MANIFEST)
    assert recorded_input(_handoff(chosen)) == chosen


def test_a_rerun_accepts_an_input_whose_manifest_changed_only_in_provenance(tmp_path):
    chosen = _checkpoint(tmp_path)
    handoff = _handoff(chosen)
    _rewrite_manifest(chosen, lambda m: m["extra"].update(source="/elsewhere/step-000002"))
    assert recorded_input(handoff) == chosen


def test_a_rerun_refuses_an_input_that_holds_other_state_naming_both_digests(tmp_path):
    chosen = _checkpoint(tmp_path)
    handoff = _handoff(chosen)
    recorded = content_digest_of(chosen)
    (chosen / "model.json").write_text(json.dumps({"model": 2}))
    entry = content_hash.hash_file(chosen / "model.json", SCHEME)
    _rewrite_manifest(chosen, lambda m: m["files"].update({"model.json": entry}))
    with pytest.raises(RerunNotPossible) as refused:
        recorded_input(handoff)
    assert str(refused.value) == (
        f"handoff 5: cannot re-run: its input checkpoint {chosen} has content digest "
        f"{content_digest_of(chosen)}, the handoff recorded {recorded}: it no longer holds "
        "what was handed off")


def test_an_older_record_without_a_content_digest_is_checked_by_manifest_sha256(tmp_path):
    chosen = _checkpoint(tmp_path)
    handoff = _handoff(chosen)
    for key in ("input_content_digest", "output_content_digest"):
        del handoff.reshard[key]
    assert recorded_input(handoff) == chosen
    recorded = handoff.reshard["output_manifest_sha256"]
    _rewrite_manifest(chosen, lambda m: m["extra"].update(source="/elsewhere/step-000002"))
    with pytest.raises(RerunNotPossible, match=f"has manifest.json sha256 "
                       f"{manifest.checksum_of(chosen / MANIFEST)}, the handoff recorded {recorded}"):
        recorded_input(handoff)
