"""pairaudit.serving.vllmsizing and the vLLM GPU example's start settings, checked against the model they serve."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pairaudit.serving import modelstore, vllmsizing

EXAMPLE = Path(__file__).resolve().parents[1] / "config" / "examples" / "vllm-gpu.yaml"


def test_bytes_per_token_follow_the_shape():
    llama = {"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 512}
    # head_dim from hidden / heads (64): 2 x 2 layers x 2 KV heads x 64 x 2 bytes
    assert vllmsizing.kv_bytes_per_token(llama, 2) == 1024
    # no num_key_value_heads: every attention head keeps its own K and V
    mha = {k: v for k, v in llama.items() if k != "num_key_value_heads"}
    assert vllmsizing.kv_bytes_per_token(mha, 2) == 4 * 1024
    assert vllmsizing.kv_cache_bytes(llama, max_num_seqs=3, max_model_len=10, element_bytes=1) == 3 * 10 * 512
    with pytest.raises(ValueError):
        vllmsizing.kv_cache_bytes(llama, max_num_seqs=0, max_model_len=10)


def test_flag_value_reads_both_forms():
    argv = ["vllm", "--a", "1", "--b=two", "--c"]
    assert vllmsizing.flag_value(argv, "--a") == "1"
    assert vllmsizing.flag_value(argv, "--b") == "two"
    assert vllmsizing.flag_value(argv, "--c") is None and vllmsizing.flag_value(argv, "--d") is None


def test_the_gpu_example_sizes_its_kv_cache_for_what_the_audit_holds():
    """The example's --kv-cache-memory-bytes is max_num_seqs full sequences of the embedded model in bfloat16."""
    try:
        model_dir, _ = modelstore.resolve_model(modelstore.EMBEDDED_NAME)
    except Exception as exc:   # the model package is installed by ./install.sh; without it there is no shape
        pytest.skip(f"embedded model not available: {exc}")
    shape = json.loads((model_dir / "config.json").read_text())
    cfg = yaml.safe_load(EXAMPLE.read_text())
    cmd = cfg["server"]["command"]
    seqs = int(vllmsizing.flag_value(cmd, "--max-num-seqs"))
    assert seqs == cfg["sampling"]["concurrency"]   # the sampling concurrency is the most sequences at once
    want = vllmsizing.kv_cache_bytes(shape, max_num_seqs=seqs, max_model_len=cfg["server"]["max_model_len"])
    assert int(vllmsizing.flag_value(cmd, "--kv-cache-memory-bytes")) == want
    # the graphs captured are the batch sizes the audit runs: 1 (greedy, probes, boundary, speed) up to seqs
    sizes = json.loads(vllmsizing.flag_value(cmd, "--compilation-config"))["cudagraph_capture_sizes"]
    assert sizes[0] == 1 and sizes[-1] == seqs and sizes == sorted(set(sizes))
    assert all(c["concurrency"] in sizes for c in cfg["speed"]["cells"])
    # the utilization no longer sizes the cache; both arms share the command, the change adds only its switch
    assert vllmsizing.flag_value(cmd, "--gpu-memory-utilization") is None
    assert [s["flag"] for s in cfg["change"]["switches"]] == ["--kv-cache-dtype"]
