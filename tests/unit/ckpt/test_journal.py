"""The step journal: segments round-trip, are committed atomically and never rewritten,
and any damage is refused with a message naming the segment and the problem."""
from __future__ import annotations

import json

import pytest
import torch

from ckpt import journal
from ckpt.journal import JournalDamaged, JournalSegmentExists

FIX = ("a damaged journal is never replayed: restore the segment from a copy, or resume "
       "from a checkpoint at or after this step")


def _records(step: int = 7) -> dict:
    return {"step": step, "kl": {"coef": 0.1, "target": 6.0}, "rewards": [0.1, -2.5, 3],
            "prompt_ids": [11, 12], "note": "ok"}


def _tensors() -> dict[str, torch.Tensor]:
    return {"tokens": torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int64),
            "logprobs": torch.tensor([-0.1, -2.25, -0.003], dtype=torch.float32),
            "values": torch.tensor([0.1, 0.2], dtype=torch.float64)}


def _rewrite_manifest(seg, edit) -> None:
    path = seg / journal.MANIFEST
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


def test_a_segment_round_trips_records_and_tensors_with_their_dtypes(tmp_path):
    seg = journal.write_segment(tmp_path / "journal", 7, _records(), _tensors())
    root = tmp_path / "journal"
    assert seg == root / "step-000007" == journal.segment_dir(root, 7)
    assert sorted(p.name for p in seg.iterdir()) == ["manifest.json", "records.json",
                                                      "tensors.safetensors"]
    manifest = json.loads((seg / "manifest.json").read_text())
    assert manifest["format"] == journal.SEGMENT_FORMAT == "baton.journal-segment/1"
    assert manifest["step"] == 7 and sorted(manifest["files"]) == ["records.json",
                                                                   "tensors.safetensors"]
    records, tensors = journal.read_segment(tmp_path / "journal", 7)
    assert records == _records()
    assert sorted(tensors) == sorted(_tensors())
    for name, expected in _tensors().items():
        assert tensors[name].dtype == expected.dtype
        assert torch.equal(tensors[name], expected)


def test_views_that_share_storage_and_non_contiguous_tensors_are_saved(tmp_path):
    tokens = torch.arange(12).reshape(3, 4)
    journal.write_segment(tmp_path, 1, {}, {"tokens": tokens, "head": tokens[:1],
                                             "columns": tokens.t()})
    _, tensors = journal.read_segment(tmp_path, 1)
    assert torch.equal(tensors["head"], tokens[:1]) and torch.equal(tensors["columns"], tokens.t())


def test_a_segment_with_no_tensors_round_trips(tmp_path):
    journal.write_segment(tmp_path, 0, {"only": "records"}, {})
    assert journal.read_segment(tmp_path, 0) == ({"only": "records"}, {})


def test_a_committed_step_is_never_rewritten(tmp_path):
    seg = journal.write_segment(tmp_path, 3, _records(3), _tensors())
    before = {p.name: p.read_bytes() for p in seg.iterdir()}
    with pytest.raises(JournalSegmentExists) as caught:
        journal.write_segment(tmp_path, 3, {"other": 1}, {})
    assert str(caught.value) == (
        f"{seg}: step 3 is already committed; the journal is append-only and a committed "
        "step is never rewritten, so nothing was written. Continue from the step after the "
        "journal's last committed one, or write to a new journal directory")
    assert caught.value.path == str(seg) and caught.value.step == 3
    assert {p.name: p.read_bytes() for p in seg.iterdir()} == before


def test_an_interrupted_write_is_replaced_and_never_counted(tmp_path):
    staging = tmp_path / ".step-000002.tmp"
    staging.mkdir()
    (staging / "records.json").write_text("{half")
    (tmp_path / "step-000004").mkdir()  # no manifest: never committed
    (tmp_path / "notes.txt").write_text("not a segment")
    journal.write_segment(tmp_path, 1, {}, {})
    assert journal.committed_steps(tmp_path) == [1]
    journal.write_segment(tmp_path, 2, {"step": 2}, {})
    assert not staging.exists()
    assert journal.committed_steps(tmp_path) == [1, 2]
    assert journal.read_segment(tmp_path, 2) == ({"step": 2}, {})


def test_committed_steps_of_a_missing_root_is_empty(tmp_path):
    assert journal.committed_steps(tmp_path / "absent") == []


def test_a_segment_without_manifest_is_not_committed(tmp_path):
    seg = journal.write_segment(tmp_path, 5, _records(5), {})
    (seg / "manifest.json").unlink()
    assert journal.committed_steps(tmp_path) == []
    with pytest.raises(JournalDamaged) as caught:
        journal.read_segment(tmp_path, 5)
    assert str(caught.value) == (f"{seg}: journal is damaged: manifest.json is missing: "
                                 f"step 5 was never committed; {FIX}")


def test_a_flipped_tensor_byte_is_refused_by_its_sha256(tmp_path):
    seg = journal.write_segment(tmp_path, 7, _records(), _tensors())
    path = seg / "tensors.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(JournalDamaged) as caught:
        journal.read_segment(tmp_path, 7)
    message = str(caught.value)
    assert message.startswith(f"{seg}: journal is damaged: tensors.safetensors sha256 is ")
    assert ", expected " in message and message.endswith(FIX)
    assert caught.value.path == str(seg) and "sha256" in caught.value.problem


def test_a_truncated_records_file_is_refused_by_its_size(tmp_path):
    seg = journal.write_segment(tmp_path, 7, _records(), _tensors())
    path = seg / "records.json"
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[:10])
    with pytest.raises(JournalDamaged) as caught:
        journal.read_segment(tmp_path, 7)
    assert str(caught.value) == (f"{seg}: journal is damaged: records.json size is 10 bytes, "
                                 f"expected {size}; {FIX}")


def test_a_missing_file_is_refused(tmp_path):
    seg = journal.write_segment(tmp_path, 7, _records(), _tensors())
    (seg / "records.json").unlink()
    with pytest.raises(JournalDamaged, match="records.json is missing, expected the file"):
        journal.read_segment(tmp_path, 7)


def test_extra_files_in_a_segment_are_not_an_error(tmp_path):
    seg = journal.write_segment(tmp_path, 7, _records(), {})
    (seg / "README").write_text("copied here by an operator")
    assert journal.read_segment(tmp_path, 7) == (_records(), {})


def test_a_manifest_naming_a_path_outside_the_segment_is_refused(tmp_path):
    seg = journal.write_segment(tmp_path, 7, _records(), {})
    (tmp_path / "x").write_text("{}")
    _rewrite_manifest(seg, lambda m: m["files"].update({"../x": m["files"].pop("records.json")}))
    with pytest.raises(JournalDamaged) as caught:
        journal.read_segment(tmp_path, 7)
    assert str(caught.value) == (
        f"{seg}: journal is damaged: manifest.json lists files ['../x', 'tensors.safetensors'], "
        f"expected exactly ['records.json', 'tensors.safetensors']; nothing was read; {FIX}")


def test_a_manifest_of_another_format_or_step_is_refused(tmp_path):
    seg = journal.write_segment(tmp_path, 7, _records(), {})
    _rewrite_manifest(seg, lambda m: m.update(step=8))
    with pytest.raises(JournalDamaged, match="manifest.json is for step 8, expected step 7"):
        journal.read_segment(tmp_path, 7)
    _rewrite_manifest(seg, lambda m: m.update(step=7, format="baton.journal-segment/9"))
    with pytest.raises(JournalDamaged) as caught:
        journal.read_segment(tmp_path, 7)
    assert caught.value.problem == ("manifest.json has format 'baton.journal-segment/9', "
                                    "expected 'baton.journal-segment/1'")


def test_verify_names_the_first_missing_step(tmp_path):
    for step in (1, 3):
        journal.write_segment(tmp_path, step, _records(step), {})
    with pytest.raises(JournalDamaged) as caught:
        journal.verify(tmp_path, 1, 3)
    assert str(caught.value) == (f"{tmp_path / 'step-000002'}: journal is damaged: step 2 is "
                                 f"missing: the journal has steps [1, 3]; {FIX}")


def test_verify_returns_the_intact_steps_it_checked(tmp_path):
    for step in (1, 2, 3, 4):
        journal.write_segment(tmp_path, step, _records(step), _tensors())
    assert journal.verify(tmp_path, 1, 3) == [1, 2, 3]
    assert journal.verify(tmp_path, 3, 2) == []


def test_verify_refuses_a_damaged_step_in_range(tmp_path):
    for step in (1, 2, 3):
        journal.write_segment(tmp_path, step, _records(step), _tensors())
    path = journal.segment_dir(tmp_path, 2) / "records.json"
    path.write_text(path.read_text().replace("0.1", "0.2"))
    with pytest.raises(JournalDamaged, match=r"step-000002: journal is damaged: records.json "
                                             r"sha256 is [0-9a-f]{64}, expected [0-9a-f]{64}"):
        journal.verify(tmp_path, 1, 3)


def test_gaps_in_a_long_journal_are_named_as_spans(tmp_path):
    for step in (1, 2, 3, 4, 6, 9, 10):
        journal.write_segment(tmp_path, step, {}, {})
    with pytest.raises(JournalDamaged, match=r"step 5 is missing: the journal has steps "
                                             r"\[1-4, 6, 9-10\]"):
        journal.verify(tmp_path, 1, 10)
