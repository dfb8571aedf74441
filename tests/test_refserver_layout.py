"""The reference server's kept layout: mapped when complete, rebuilt when not, never a change of bits."""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from pairaudit.refserver import model as refmodel
from pairaudit.refserver.model import KVCache, LlamaModel, Segment

HIDDEN, HEADS, KV_HEADS, LAYERS, VOCAB, INTER = 64, 4, 2, 2, 96, 128


def _checkpoint(path, tied: bool):
    """A random llama checkpoint small enough to build in milliseconds."""
    g = torch.Generator().manual_seed(7)
    hd = HIDDEN // HEADS

    def r(*shape):
        return torch.randn(*shape, generator=g) * 0.2

    w = {"model.embed_tokens.weight": r(VOCAB, HIDDEN), "model.norm.weight": 1 + r(HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w |= {p + "input_layernorm.weight": 1 + r(HIDDEN), p + "post_attention_layernorm.weight": 1 + r(HIDDEN),
              p + "self_attn.q_proj.weight": r(HEADS * hd, HIDDEN), p + "self_attn.k_proj.weight": r(KV_HEADS * hd, HIDDEN),
              p + "self_attn.v_proj.weight": r(KV_HEADS * hd, HIDDEN), p + "self_attn.o_proj.weight": r(HIDDEN, HIDDEN),
              p + "mlp.gate_proj.weight": r(INTER, HIDDEN), p + "mlp.up_proj.weight": r(INTER, HIDDEN),
              p + "mlp.down_proj.weight": r(HIDDEN, INTER)}
    if not tied:
        w["lm_head.weight"] = r(VOCAB, HIDDEN)
    path.mkdir()
    save_file(w, path / "model.safetensors")
    (path / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": HIDDEN, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "num_hidden_layers": LAYERS, "vocab_size": VOCAB, "rms_norm_eps": 1e-5, "max_position_embeddings": 64}))
    return path


@pytest.fixture(params=[True, False], ids=["tied-head", "untied-head"])
def ckpt(request, tmp_path):
    return _checkpoint(tmp_path / "ckpt", tied=request.param)


def _outputs(m: LlamaModel):
    """Logits of a 5-token prefill and of one decode step after it, in both heads' row shapes."""
    cache = KVCache(m.cfg, capacity=8)
    prefill = m.forward(torch.tensor([3, 1, 4, 1, 5]), [Segment(cache, 0, 5)])
    cache.length = 5
    step = m.forward(torch.tensor([9]), [Segment(cache, 5, 1)])
    return m.logits(prefill), m.logits(step)


def test_a_kept_layout_is_mapped_and_computes_bit_for_bit_as_a_built_one(ckpt, tmp_path, monkeypatch):
    cache = tmp_path / "layouts" / "w.v1.pt"
    built = _outputs(LlamaModel(ckpt))
    first = LlamaModel(ckpt, layout_cache=cache)  # builds, keeps, maps
    assert [f.name for f in cache.parent.iterdir()] == [cache.name]  # no temp file left beside it
    # the second start must not rebuild: a build now would fail the test
    monkeypatch.setattr(refmodel, "build_layout", lambda *a: pytest.fail("rebuilt a complete kept layout"))
    second = LlamaModel(ckpt, layout_cache=cache)
    for m in (first, second):
        for a, b in zip(_outputs(m), built):
            assert torch.equal(a, b)
    # mapped from the file, and aligned as freshly allocated weights are
    assert str(cache) in Path("/proc/self/maps").read_text()
    for lin in (second.head, *(getattr(layer, n) for layer in second.layers for n in ("qkv", "o", "gate_up", "down"))):
        assert lin.w.data_ptr() % 64 == 0 and lin.wt.data_ptr() % 64 == 0


@pytest.mark.parametrize("damage", ["truncated", "garbage", "other-layout"])
def test_a_damaged_or_foreign_kept_layout_is_rebuilt(ckpt, tmp_path, damage, caplog):
    cache = tmp_path / "w.v1.pt"
    built = _outputs(LlamaModel(ckpt))
    LlamaModel(ckpt, layout_cache=cache)
    if damage == "truncated":
        cache.write_bytes(cache.read_bytes()[: cache.stat().st_size // 2])
    elif damage == "garbage":
        cache.write_bytes(b"not a layout")
    else:
        torch.save({"layout": "another-build", "tensors": {}}, cache)
    with caplog.at_level(logging.WARNING, logger="refserver"):
        m = LlamaModel(ckpt, layout_cache=cache)
    assert "rebuilding the served layout" in caplog.text
    for a, b in zip(_outputs(m), built):
        assert torch.equal(a, b)
    assert torch.load(cache, mmap=True, weights_only=True)["layout"] == refmodel.LAYOUT_ID  # kept anew


def test_an_unwritable_cache_costs_only_speed(ckpt, tmp_path, caplog):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING, logger="refserver"):
        m = LlamaModel(ckpt, layout_cache=blocker / "w.v1.pt")
    assert "serving without a kept layout" in caplog.text
    for a, b in zip(_outputs(m), _outputs(LlamaModel(ckpt))):
        assert torch.equal(a, b)


def test_the_bf16_head_is_built_from_the_kept_layout_on_the_bf16_grid(ckpt, tmp_path):
    m = LlamaModel(ckpt, lm_head_bf16=True, layout_cache=tmp_path / "w.v1.pt")
    for logits in _outputs(m):
        assert torch.equal(logits, logits.to(torch.bfloat16).float())


def test_the_kept_layout_is_keyed_by_weights_and_build_code_and_replaces_older_builds(ckpt, tmp_path, monkeypatch):
    monkeypatch.setenv("PAIRAUDIT_CACHE", str(tmp_path / "cache"))
    p = refmodel.layout_cache_path("ab12")
    assert p == tmp_path / "cache" / "layouts" / f"ab12.{refmodel.LAYOUT_ID}.pt"
    older, other = p.with_name("ab12.0123456789abcdef.pt"), p.with_name("cd34.0123456789abcdef.pt")
    for f in (older, other):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"an earlier build")
    LlamaModel(ckpt, layout_cache=p)
    assert p.is_file() and not older.exists() and other.exists()  # another checkpoint's layout is kept
    # named by the build's own code, so editing it can never map a stale layout
    assert refmodel.LAYOUT_ID == hashlib.sha256(inspect.getsource(refmodel.build_layout).encode()).hexdigest()[:16]
