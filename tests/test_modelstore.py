"""The model store: the packaged GGUF is verified and converted once per sha256."""

from __future__ import annotations

import json

import pytest

from pairaudit.serving import modelstore


def test_embedded_gguf_is_the_pinned_file():
    path = modelstore.embedded_gguf()
    assert path.name == modelstore.EMBEDDED_GGUF
    assert modelstore.file_sha256(path) == modelstore.EMBEDDED_GGUF_SHA256


def test_conversion_runs_once_per_gguf_sha(tmp_path, monkeypatch):
    calls = []

    def fake_convert(gguf, sha, dest):
        calls.append((gguf, sha, dest))
        dest.mkdir(parents=True)
        (dest / "SOURCE.json").write_text(json.dumps({"gguf_sha256": sha}))
        (dest / "tokenizer_config.json").write_text(json.dumps({"eos_token": modelstore.EMBEDDED_EOS}))

    monkeypatch.setenv("PAIRAUDIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(modelstore, "_convert", fake_convert)
    first, ident = modelstore.resolve_model(modelstore.EMBEDDED_NAME)
    again, _ = modelstore.resolve_model(modelstore.EMBEDDED_NAME)
    assert first == again == tmp_path / "cache" / "models" / modelstore.EMBEDDED_GGUF_SHA256
    assert len(calls) == 1 and ident["weights_sha256"] == modelstore.EMBEDDED_GGUF_SHA256
    # a different GGUF (a new package release) is a new key, converted afresh
    other = tmp_path / "other.gguf"
    other.write_bytes(b"not the same weights")
    monkeypatch.setattr(modelstore, "embedded_gguf", lambda: other)
    monkeypatch.setattr(modelstore, "EMBEDDED_GGUF_SHA256", modelstore.file_sha256(other))
    third, _ = modelstore.resolve_model(modelstore.EMBEDDED_NAME)
    assert len(calls) == 2 and third != first and third.name == modelstore.file_sha256(other)


def test_a_copy_that_stops_on_another_token_is_retired_and_converted_afresh(tmp_path, monkeypatch):
    calls = []

    def fake_convert(gguf, sha, dest):
        calls.append(sha)
        dest.mkdir(parents=True)
        (dest / "SOURCE.json").write_text(json.dumps({"gguf_sha256": sha}))
        (dest / "tokenizer_config.json").write_text(json.dumps({"eos_token": modelstore.EMBEDDED_EOS}))

    monkeypatch.setenv("PAIRAUDIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(modelstore, "_convert", fake_convert)
    models = tmp_path / "cache" / "models"
    bad = models / modelstore.EMBEDDED_GGUF_SHA256
    bad.mkdir(parents=True)
    (bad / "SOURCE.json").write_text("{}")   # converted before the end-of-turn check, by a transformers that misread it
    (bad / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|im_start|>"}}))
    path, _ = modelstore.resolve_model(modelstore.EMBEDDED_NAME)
    assert path == bad and calls == [modelstore.EMBEDDED_GGUF_SHA256]
    assert modelstore.cached_eos(path) == modelstore.EMBEDDED_EOS
    retired = [p for p in models.iterdir() if ".retired-" in p.name]
    assert len(retired) == 1 and modelstore.cached_eos(retired[0]) == "<|im_start|>"   # kept beside, not deleted
    modelstore.resolve_model(modelstore.EMBEDDED_NAME)
    assert len(calls) == 1   # a good copy is used as it is


def test_the_real_cache_stops_on_the_ggufs_end_of_turn_token():
    path, _ = modelstore.resolve_model(modelstore.EMBEDDED_NAME)
    assert modelstore.cached_eos(path) == modelstore.EMBEDDED_EOS


def test_swapped_gguf_is_refused(tmp_path, monkeypatch):
    bad = tmp_path / "swapped.gguf"
    bad.write_bytes(b"tampered")
    monkeypatch.setattr(modelstore, "embedded_gguf", lambda: bad)
    with pytest.raises(modelstore.ModelError, match="sha256"):
        modelstore.resolve_model(modelstore.EMBEDDED_NAME)


def test_an_unchanged_file_is_not_hashed_again_and_a_rewritten_one_is(tmp_path, monkeypatch):
    monkeypatch.setenv("PAIRAUDIT_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "weights.gguf"
    f.write_bytes(b"the pinned weights")
    first = modelstore.verified_sha256(f)
    assert first == modelstore.file_sha256(f)
    hashed = []
    real = modelstore.file_sha256
    monkeypatch.setattr(modelstore, "file_sha256", lambda p: hashed.append(p) or real(p))
    assert modelstore.verified_sha256(f) == first and hashed == []  # a stat, no hash
    # rewritten in place at the same size: its mtime and ctime moved, so it is hashed again
    f.write_bytes(b"the swapped weight")
    assert modelstore.verified_sha256(f) == real(f) != first and len(hashed) == 1
    # and resolving it as the embedded model is refused
    monkeypatch.setattr(modelstore, "embedded_gguf", lambda: f)
    monkeypatch.setattr(modelstore, "EMBEDDED_GGUF_SHA256", first)
    with pytest.raises(modelstore.ModelError, match="sha256"):
        modelstore.resolve_model(modelstore.EMBEDDED_NAME)


def test_unknown_model_names_the_argument(tmp_path):
    with pytest.raises(modelstore.ModelError, match="nope"):
        modelstore.resolve_model(str(tmp_path / "nope"))


def test_local_directory_identity_hashes_its_weights(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"abc")
    path, ident = modelstore.resolve_model(str(tmp_path))
    (tmp_path / "model.safetensors").write_bytes(b"abd")
    _, changed = modelstore.resolve_model(str(tmp_path))
    assert path == tmp_path and ident["weights_sha256"] != changed["weights_sha256"]
