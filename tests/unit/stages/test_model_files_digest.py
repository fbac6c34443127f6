"""stages.model.model_files_digest: what a model's identity is computed from, as a digest."""
from __future__ import annotations

from stages.model import model_files_digest


def test_it_follows_config_and_tokenizer_files_and_ignores_weights(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 128}')
    (tmp_path / "tokenizer.json").write_text('{"model": {}}')
    (tmp_path / "model.safetensors").write_bytes(b"weights v1")
    first = model_files_digest(tmp_path)
    assert first.startswith("mf1:") and model_files_digest(tmp_path) == first
    (tmp_path / "model.safetensors").write_bytes(b"weights v2, fine-tuned")
    assert model_files_digest(tmp_path) == first  # weights never change the identity
    (tmp_path / "config.json").write_text('{"hidden_size": 64}')
    changed = model_files_digest(tmp_path)
    assert changed != first
    (tmp_path / "special_tokens_map.json").write_text("{}")
    assert model_files_digest(tmp_path) != changed  # a new tokenizer file counts too
