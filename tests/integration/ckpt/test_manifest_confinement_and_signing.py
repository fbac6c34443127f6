"""Manifest paths stay inside their checkpoint; signed manifests refuse any other writer.

Fake checkpoints (JSON files only, no DeepSpeed): fast. The same refusals on real
checkpoints are in tests/integration/ckpt/test_malicious_checkpoints.py.
"""
from __future__ import annotations

import json
import os

import pytest

from core.errors import ConfigError
from ckpt import commit, manifest, signing
from ckpt.errors import BadSignature, CorruptCheckpoint, UnconfinedPath
from ckpt.layout import step_dirname
from ckpt.reader import CheckpointReader
from tests.conftest import run_baton

KEY_ENV = "BATON_UNIT_SIGNING_KEY"


@pytest.fixture(autouse=True)
def signing_off():
    """Signing is process-wide state: every test starts and ends without it."""
    signing.configure(None)
    yield
    signing.configure(None)


@pytest.fixture
def key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "unit-test-key-0123456789")
    return KEY_ENV


def _fake_checkpoint(root, step=1):
    tmp = commit.clear_stale_tmp(root, step_dirname(step))
    tmp.mkdir(parents=True)
    files = {}
    for comp in manifest.REQUIRED:
        rel = f"{comp}.json"
        (tmp / rel).write_text(json.dumps({"step": step}))
        files[rel] = {"size": (tmp / rel).stat().st_size, "sha256": manifest.sha256_file(tmp / rel)}
    m = manifest.Manifest(stage="cpt", step=step, components={c: [f"{c}.json"] for c in manifest.REQUIRED},
                          files=files, parallel={"world_size": 1, "zero_stage": 0})
    return commit.commit(tmp, m)


def _rewrite(ckpt, edit):
    path = ckpt / "manifest.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _list_file(ckpt, rel, size=5, sha="0" * 64):
    """Add `rel` to the manifest's files and to the `data` component, as an attacker would."""
    def edit(data):
        data["files"][rel] = {"size": size, "sha256": sha}
        data["components"]["data"].append(rel)
    _rewrite(ckpt, edit)


# -- path confinement -------------------------------------------------------------------
@pytest.mark.parametrize("rel,why", [
    ("../../outside.json", "has a '.' or '..' segment"),
    ("/etc/hostname", "is absolute"),
    ("a/../../x", "has a '.' or '..' segment"),
    ("./data.json", "has a '.' or '..' segment"),
    ("rng//rank-0.json", "has an empty segment"),
    ("rng\\rank-0.json", "contains a backslash"),
])
def test_a_manifest_path_that_is_not_relative_and_normalized_is_refused_by_name(tmp_path, rel, why):
    ckpt = _fake_checkpoint(tmp_path)
    _list_file(ckpt, rel)
    with pytest.raises(UnconfinedPath) as err:
        manifest.verify(ckpt)
    assert f"{rel!r} {why}" in str(err.value)
    assert "lists paths outside the checkpoint directory; nothing was read" in str(err.value)


def test_a_path_only_in_the_component_list_is_checked_too(tmp_path):
    ckpt = _fake_checkpoint(tmp_path)
    _rewrite(ckpt, lambda data: data["components"]["model"].append("../model.json"))
    with pytest.raises(UnconfinedPath, match=r"'../model.json' has a '.' or '..' segment"):
        manifest.read(ckpt)


def test_a_listed_symlink_to_a_file_outside_is_refused_even_with_a_matching_checksum(tmp_path):
    outside = tmp_path / "secret.json"
    outside.write_text('{"step": 1}')
    ckpt = _fake_checkpoint(tmp_path / "root")
    (ckpt / "data.json").unlink()
    (ckpt / "data.json").symlink_to(outside)
    _list_file(ckpt, "data.json", outside.stat().st_size, manifest.sha256_file(outside))
    with pytest.raises(UnconfinedPath) as err:
        manifest.verify(ckpt)
    assert f"'data.json' resolves to {outside}" in str(err.value)


def test_a_symlinked_directory_leading_outside_is_named(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "rank-00000.json").write_text("{}")
    ckpt = _fake_checkpoint(tmp_path / "root")
    (ckpt / "rng").symlink_to(tmp_path / "elsewhere")
    _list_file(ckpt, "rng/rank-00000.json", 2)
    with pytest.raises(UnconfinedPath, match="through the symlink rng, outside the checkpoint"):
        manifest.read(ckpt)


def test_a_symlink_that_stays_inside_the_checkpoint_is_accepted(tmp_path):
    ckpt = _fake_checkpoint(tmp_path)
    (ckpt / "alias.json").symlink_to(ckpt / "data.json")
    entry = json.loads((ckpt / "manifest.json").read_text())["files"]["data.json"]
    _list_file(ckpt, "alias.json", entry["size"], entry["sha256"])
    assert "alias.json" in manifest.verify(ckpt).files


def test_baton_ckpt_verify_refuses_traversal_and_symlink_escape_naming_the_path(tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text('{"step": 1}')
    traversal = _fake_checkpoint(tmp_path / "a")
    _list_file(traversal, "../../outside.json", outside.stat().st_size, manifest.sha256_file(outside))
    escape = _fake_checkpoint(tmp_path / "b")
    (escape / "data.json").unlink()
    (escape / "data.json").symlink_to(outside)
    _list_file(escape, "data.json", outside.stat().st_size, manifest.sha256_file(outside))
    for ckpt, named in ((traversal, "'../../outside.json' has a '.' or '..' segment"),
                        (escape, f"'data.json' resolves to {outside}")):
        proc = run_baton("ckpt", "verify", str(ckpt))
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert named in proc.stderr and "Traceback" not in proc.stderr
        assert "checksums match" not in proc.stdout


# -- signing ------------------------------------------------------------------------------
def test_a_manifest_written_with_a_key_is_signed_and_verifies_with_it(tmp_path, key):
    signing.configure(key)
    ckpt = _fake_checkpoint(tmp_path)
    written = json.loads((ckpt / "manifest.json").read_text())
    assert written["signature"]["alg"] == "hmac-sha256" and len(written["signature"]["value"]) == 64
    assert manifest.verify(ckpt).step == 1
    assert os.environ[key] not in (ckpt / "manifest.json").read_text()


def test_with_a_key_an_unsigned_manifest_is_refused_and_without_one_signatures_are_ignored(tmp_path, key):
    unsigned = _fake_checkpoint(tmp_path / "unsigned")
    signing.configure(key)
    signed = _fake_checkpoint(tmp_path / "signed")
    with pytest.raises(BadSignature, match=f"manifest.json is not signed; with ckpt.signing_key_env={key}"):
        manifest.verify(unsigned)
    signing.configure(None)
    assert manifest.verify(unsigned).step == manifest.verify(signed).step == 1


def test_a_rewritten_manifest_is_refused_before_any_listed_file_is_read(tmp_path, key):
    signing.configure(key)
    ckpt = _fake_checkpoint(tmp_path)
    (ckpt / "data.json").write_text('{"step": 666}')
    (ckpt / "rng.json").unlink()  # were any file looked at, this would be "missing file"
    _rewrite(ckpt, lambda data: data["files"]["data.json"].update(
        size=(ckpt / "data.json").stat().st_size, sha256=manifest.sha256_file(ckpt / "data.json")))
    with pytest.raises(BadSignature) as err:
        CheckpointReader(ckpt).json("data.json")
    assert "has a signature that does not match its content" in str(err.value)
    assert "missing file" not in str(err.value)


def test_a_manifest_signed_with_another_key_is_refused(tmp_path, key, monkeypatch):
    signing.configure(key)
    ckpt = _fake_checkpoint(tmp_path)
    monkeypatch.setenv(key, "a-different-key")
    with pytest.raises(BadSignature, match="does not match its content"):
        manifest.read(ckpt)


def test_a_signing_key_variable_that_is_unset_or_empty_is_a_config_error(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "")
    with pytest.raises(ConfigError, match=f"the environment variable {KEY_ENV} is not set or is empty"):
        signing.configure(KEY_ENV)
    with pytest.raises(ConfigError, match="expected the name of an environment variable"):
        signing.configure("not a name=")


def test_the_signature_survives_a_json_round_trip_of_int_keys_and_tuples(key):
    signing.configure(key)
    data = {"files": {}, "extra": {"by_rank": {2: "a", 10: "b"}, "shape": (1, 2)}}
    signed = {**data, "signature": signing.signature_for(data)}
    signing.check("x", json.loads(json.dumps(signed)))  # no BadSignature


def test_the_ckpt_commands_take_the_signing_override_and_nothing_else():
    assert signing.split_override(["ckpt.signing_key_env=K", "a=b"]) == ("K", ["a=b"])
    assert signing.split_override(["ckpt.signing_key_env=null"]) == (None, [])


def test_baton_ckpt_verify_with_the_key_refuses_a_tampered_signed_manifest(tmp_path, key):
    signing.configure(key)
    ckpt = _fake_checkpoint(tmp_path)
    signing.configure(None)
    env = {key: os.environ[key]}
    ok = run_baton("ckpt", "verify", str(ckpt), f"ckpt.signing_key_env={key}", env=env)
    assert ok.returncode == 0, ok.stderr
    _rewrite(ckpt, lambda data: data.update(step=2))
    refused = run_baton("ckpt", "verify", str(ckpt), f"ckpt.signing_key_env={key}", env=env)
    assert refused.returncode == 1
    assert "has a signature that does not match its content" in refused.stderr
    unknown = run_baton("ckpt", "verify", str(ckpt), "run.dir=/tmp/x")
    assert unknown.returncode == 2
    assert "takes no config overrides except ckpt.signing_key_env=NAME" in unknown.stderr


def test_a_file_changed_between_verify_and_read_is_refused_by_the_reader(tmp_path):
    ckpt = _fake_checkpoint(tmp_path)
    reader = CheckpointReader(ckpt, manifest.verify(ckpt))
    (ckpt / "data.json").write_text('{"step": 7}')  # same size, other bytes
    with pytest.raises(CorruptCheckpoint, match="checksum mismatch in data.json"):
        reader.json("data.json")
