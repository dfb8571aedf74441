"""bench/gpu/vllm_flags.py: a config's flags checked against a vLLM's --help, and what it does with unknown ones."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "gpu" / "vllm_flags.py"
_spec = importlib.util.spec_from_file_location("vllm_flags", BENCH)
assert _spec and _spec.loader
flags = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(flags)

# a --help of an older vLLM: no --kv-cache-memory-bytes, no --compilation-config
OLD_HELP = """usage: api_server.py [-h] [--model MODEL] [--max-model-len MAX_MODEL_LEN] [--gpu-memory-utilization G]
  --max-num-seqs MAX_NUM_SEQS  --kv-cache-dtype {auto,fp8}  --enforce-eager  --seed SEED"""
CMD = ["py", "-m", "vllm.entrypoints.openai.api_server", "--model", "m", "--max-num-seqs", "16",
       "--kv-cache-memory-bytes", "754974720", "--compilation-config", '{"cudagraph_capture_sizes": [1, 2]}',
       "--enforce-eager", "--seed", "0"]


def test_known_flags_are_kept_as_they_are():
    new_help = OLD_HELP + "\n  --kv-cache-memory-bytes KV  --compilation-config, -cc CC"
    out, notes = flags.adapt(CMD, new_help, total=80 << 30)
    assert out == CMD and notes == []


def test_unknown_flags_are_dropped_with_their_values_and_kv_bytes_become_a_utilization():
    out, notes = flags.adapt(CMD, OLD_HELP, total=80 << 30)
    # 754,974,720 bytes + 2 GiB over 80 GiB = 0.0338: rounded up to 0.04
    assert out == ["py", "-m", "vllm.entrypoints.openai.api_server", "--model", "m", "--max-num-seqs", "16",
                   "--gpu-memory-utilization", "0.04", "--enforce-eager", "--seed", "0"]
    assert [(n["flag"], n["action"]) for n in notes] == [("--kv-cache-memory-bytes", "replaced"),
                                                         ("--compilation-config", "dropped")]


def test_a_flag_is_not_known_by_a_longer_flag_that_starts_with_it():
    assert not flags.known("--kv-cache-memory", "--kv-cache-memory-bytes KV")
    assert flags.known("--kv-cache-memory-bytes", "[--kv-cache-memory-bytes KV]")
