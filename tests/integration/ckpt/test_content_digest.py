"""A checkpoint's content digest names what it holds, not where it lies or how it was made;
`baton ckpt diff` and `inspect` show it, and a copy elsewhere diffs IDENTICAL (fast: real
manifests over small JSON files, no DeepSpeed)."""
from __future__ import annotations

import copy
import json
import shutil

import pytest

from ckpt import commit, content_hash, manifest
from ckpt.content_digest import PREFIX, content_digest, content_digest_of
from ckpt.diff import diff_checkpoints
from ckpt.layout import MANIFEST, step_dirname

PARALLEL = {"world_size": 1, "zero_stage": 0, "micro_batch": 2, "global_batch": 4,
            "gradient_accumulation_steps": 2, "backend": "gloo"}
SCHEME = content_hash.scheme(chunk_bytes=64, alg=content_hash.XXH3)


def _entry(data: bytes) -> dict:
    return content_hash.entry(len(data), content_hash.hash_chunks(data, 64, alg=content_hash.XXH3))


def _manifest(**changes) -> manifest.Manifest:
    files = {f"{c}.json": _entry(json.dumps({c: 1}).encode()) for c in manifest.REQUIRED}
    fields = dict(stage="cpt", step=2, components={c: [f"{c}.json"] for c in manifest.REQUIRED},
                  files=files, parallel=dict(PARALLEL), hashing=dict(SCHEME),
                  extra={"parent": {"init_from": "/runs/a/sft/checkpoints/step-000004"}})
    return manifest.Manifest(**{**fields, **changes})


def _changed(m: manifest.Manifest, change) -> manifest.Manifest:
    other = copy.deepcopy(m)
    change(other)
    return other


def _set_file(rel: str, data: bytes):
    return lambda m: m.files.__setitem__(rel, _entry(data))


SAME_STATE = {
    "extra location fields": lambda m: m.extra.update(
        parent={"init_from": "/elsewhere/sft/checkpoints/step-000004"},
        reshard={"source": "/elsewhere/src", "resharded_from": "/elsewhere/src"}),
    "meta.json entry": _set_file("meta.json", b'{"argv": ["/elsewhere/bin/baton"]}'),
    "a copied .py script": _set_file("zero_to_fp32.py", b"# DeepSpeed's helper\n"),
    "the signature": lambda m: setattr(m, "signature", {"alg": "hmac-sha256", "value": "ab"}),
}
OTHER_STATE = {
    "a state file's hash": _set_file("model.json", b'{"model": 2}'),
    "an added state file": _set_file("rng/rank-00001.json", b"{}"),
    "the step": lambda m: setattr(m, "step", 3),
    "the stage": lambda m: setattr(m, "stage", "sft"),
    "the layout": lambda m: m.parallel.update(world_size=2, gradient_accumulation_steps=1),
    "mid-accumulation": lambda m: setattr(m, "mid_accumulation", True),
    "the hashing scheme": lambda m: setattr(m, "hashing", content_hash.scheme(128, content_hash.XXH3)),
}


@pytest.mark.parametrize("what", list(SAME_STATE))
def test_the_digest_is_equal_when_only_provenance_differs(what):
    base = _manifest()
    assert content_digest(_changed(base, SAME_STATE[what])) == content_digest(base)


@pytest.mark.parametrize("what", list(OTHER_STATE))
def test_the_digest_differs_when_the_state_differs(what):
    base = _manifest()
    assert content_digest(_changed(base, OTHER_STATE[what])) != content_digest(base)


def test_the_digest_is_prefixed_with_its_version():
    digest = content_digest(_manifest())
    assert digest.startswith(PREFIX) and len(digest) == len(PREFIX) + 64


# -- real checkpoint directories ------------------------------------------------------
def _write_checkpoint(root, meta: dict, extra: dict, progress: dict | None = None):
    """A committed cpt checkpoint of small JSON files, meta.json included."""
    name = step_dirname(2)
    tmp = commit.clear_stale_tmp(root, name)
    tmp.mkdir(parents=True)
    contents = {f"{c}.json": {c: 1} for c in manifest.REQUIRED}
    contents["meta.json"], contents["progress.json"] = meta, progress or {"step": 2}
    files = {}
    for rel, value in contents.items():
        (tmp / rel).write_text(json.dumps(value))
        files[rel] = content_hash.hash_file(tmp / rel, SCHEME)
    m = _manifest(files=files, extra=extra)
    return commit.commit(tmp, m)


def _meta(run_dir: str) -> dict:
    return {"argv": ["baton", "stage", "cpt", f"run.dir={run_dir}"], "model_dir": f"{run_dir}/model",
            "config": {"run": {"dir": run_dir}, "seed": 7}}


@pytest.fixture
def original(tmp_path):
    return _write_checkpoint(tmp_path / "a" / "cpt" / "checkpoints", _meta("/runs/a"),
                             {"parent": {"init_from": "/runs/a/sft"}})


def _moved_copy(original, destination):
    """`original` copied to `destination` with its meta.json and manifest `extra` paths
    rewritten as a run there would have written them (meta.json's entry updated with it)."""
    shutil.copytree(original, destination)
    (destination / "meta.json").write_text(json.dumps(_meta("/runs/b")))
    data = json.loads((destination / MANIFEST).read_text())
    data["files"]["meta.json"] = content_hash.hash_file(destination / "meta.json", SCHEME)
    data["extra"] = {"parent": {"resharded_from": "/runs/b/src"}, "source": "/runs/b/src"}
    (destination / MANIFEST).write_text(json.dumps(data))
    return destination


def test_a_copy_in_another_place_has_the_same_digest_and_diffs_identical(original, tmp_path):
    moved = _moved_copy(original, tmp_path / "b" / "step-000002")
    assert content_digest_of(moved) == content_digest_of(original)
    report = diff_checkpoints(original, moved)
    assert report.identical and report.same_content_digest
    assert report.content_digest_a == content_digest_of(original)
    [manifest_note, meta_note] = sorted(report.notes)
    assert meta_note.startswith("meta.json differs at argv[3], config.run.dir, model_dir "
                                "(informational:")
    assert manifest_note.startswith("manifest.json differs at extra.parent.init_from, "
                                    "extra.parent.resharded_from, extra.source (informational:")


def test_a_different_state_diffs_different_with_other_digests(original, tmp_path):
    other = _write_checkpoint(tmp_path / "c", _meta("/runs/a"), {}, progress={"step": 3})
    report = diff_checkpoints(original, other)
    assert not report.identical and not report.same_content_digest
    [differing] = [f for f in report.files if not f.identical]
    assert (differing.file, differing.first_difference) == ("progress.json", "step")


def test_a_manifest_fact_alone_makes_checkpoints_different(original, tmp_path):
    other = tmp_path / "d" / "step-000002"
    shutil.copytree(original, other)
    data = json.loads((other / MANIFEST).read_text())
    data["parallel"]["world_size"] = 2
    (other / MANIFEST).write_text(json.dumps(data))
    report = diff_checkpoints(original, other)
    assert not report.identical
    [differing] = [f for f in report.files if not f.identical]
    assert (differing.file, differing.first_difference) == (MANIFEST, "layout.world_size")


def test_baton_ckpt_diff_and_inspect_show_the_content_digest(original, tmp_path, baton):
    moved = _moved_copy(original, tmp_path / "b" / "step-000002")
    digest = content_digest_of(original)
    diff = baton("ckpt", "diff", str(original), str(moved))
    assert diff.returncode == 0, diff.stdout + diff.stderr
    lines = diff.stdout.splitlines()
    assert lines[-1] == "IDENTICAL"
    assert lines[-3:-1] == [f"content digest A: {digest}",
                            f"content digest B: {digest} (equal: the same state)"]
    assert sum(line.startswith("note: ") and "(informational:" in line for line in lines) == 2
    lines = baton("ckpt", "diff", str(original), str(moved), "--json").stdout.splitlines()
    as_json = json.loads("\n".join(lines[lines.index("{"):]))  # after DeepSpeed's log line
    assert as_json["content_digest_a"] == as_json["content_digest_b"] == digest
    inspected = baton("ckpt", "inspect", str(moved), "--json")
    assert json.loads(inspected.stdout)["content_digest"] == digest, inspected.stderr
    assert f"content digest: {digest}" in baton("ckpt", "inspect", str(moved)).stdout
