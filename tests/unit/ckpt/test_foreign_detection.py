"""`ckpt.foreign`: a directory without a baton manifest is named for what it is, from file
names alone (the files here are empty: nothing is read)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckpt import foreign, manifest
from ckpt.errors import ForeignCheckpoint, NotACheckpoint


def _touch(directory: Path, *names: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).write_bytes(b"")
    return directory


def _refusal(path: Path) -> NotACheckpoint:
    with pytest.raises(NotACheckpoint) as caught:
        manifest.read(path)
    return caught.value


def test_a_deepspeed_tag_directory_is_named_with_its_files(tmp_path):
    tag = _touch(tmp_path / "global_step5", "zero_pp_rank_0_mp_rank_00_model_states.pt",
                 "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    error = _refusal(tag)
    assert isinstance(error, ForeignCheckpoint) and error.kind == "deepspeed"
    assert str(error) == (
        f"{tag}: a DeepSpeed checkpoint (zero_pp_rank_0_mp_rank_00_model_states.pt, "
        "zero_pp_rank_0_mp_rank_00_optim_states.pt) without a baton manifest, not a baton "
        f"checkpoint; use `baton ckpt adopt {tag}` to bring it in, then use the adopted copy "
        "as stage.init_from")
    assert foreign.detect(tag).zero3


def test_a_deepspeed_root_is_followed_through_its_latest_file(tmp_path):
    _touch(tmp_path / "ds" / "global_step5", "mp_rank_00_model_states.pt")
    (tmp_path / "ds" / "latest").write_text("global_step5")
    found = foreign.detect(tmp_path / "ds")
    assert found.root == tmp_path / "ds" and found.directory.name == "global_step5"
    assert not found.zero3
    assert "a DeepSpeed checkpoint root (`latest` names global_step5" in str(_refusal(tmp_path / "ds"))


def test_a_latest_file_pointing_out_of_the_root_is_not_followed(tmp_path):
    _touch(tmp_path / "outside", "mp_rank_00_model_states.pt")
    _touch(tmp_path / "ds")
    (tmp_path / "ds" / "latest").write_text("../outside")
    assert foreign.detect(tmp_path / "ds") is None


def test_a_hugging_face_directory_lists_the_shards_its_index_names(tmp_path):
    hf = _touch(tmp_path / "hf", "config.json", "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors", "adapter_model.safetensors")
    (hf / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    found = foreign.detect(hf)
    assert found.kind == "hf"
    assert found.files == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    error = _refusal(hf)
    assert isinstance(error, ForeignCheckpoint) and error.kind == "hf"
    assert f"train from it with model.path={hf}" in str(error)


def test_a_baton_save_without_its_manifest_is_still_an_unfinished_save(tmp_path):
    step = _touch(tmp_path / "step-000002", "mp_rank_00_model_states.pt", "meta.json",
                  "progress.json")
    assert foreign.detect(step) is None
    error = _refusal(step)
    assert not isinstance(error, ForeignCheckpoint)
    assert "missing manifest.json: not a committed checkpoint" in str(error)


def test_a_directory_of_baton_checkpoints_names_the_one_latest_points_to(tmp_path):
    _touch(tmp_path / "checkpoints" / "step-000004", "manifest.json")
    (tmp_path / "checkpoints" / "latest").write_text("step-000004")
    assert str(_refusal(tmp_path / "checkpoints")).endswith(
        "a directory of baton checkpoints, not one checkpoint; its `latest` file names "
        f"step-000004: use {tmp_path / 'checkpoints' / 'step-000004'}")


def test_an_unrelated_directory_keeps_the_plain_message(tmp_path):
    _touch(tmp_path / "stuff", "notes.txt", "config.json")
    assert foreign.detect(tmp_path / "stuff") is None
    assert "missing manifest.json" in str(_refusal(tmp_path / "stuff"))
