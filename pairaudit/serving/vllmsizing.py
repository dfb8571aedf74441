"""What a vLLM arm's start needs to allocate, from what the audit asks of it.

vLLM sizes its KV cache, by default, as a fraction of the card
(``--gpu-memory-utilization``) after profiling a forward pass; on an 80 GB
card 0.3 of it was 23.75 GiB for a 135M model whose audit never holds more
than ``max_num_seqs`` sequences of ``max_model_len`` tokens (0.7 GiB).  The
audit's own need, in bytes, is what ``--kv-cache-memory-bytes`` takes (vLLM
then skips the memory profile): one key and one value vector per layer and
KV head per token, ``head_dim`` elements each.  The examples state the
number in their arms' command; ``tests/test_vllmsizing.py`` checks it against
this function and the embedded model's ``config.json``.
"""

from __future__ import annotations

from typing import Any, Mapping

def kv_bytes_per_token(model_config: Mapping[str, Any], element_bytes: int) -> int:
    """Bytes of KV cache one token takes: 2 (key, value) x layers x KV heads x head_dim x element bytes."""
    layers = int(model_config["num_hidden_layers"])
    heads = int(model_config["num_attention_heads"])
    kv_heads = int(model_config.get("num_key_value_heads") or heads)
    head_dim = int(model_config.get("head_dim") or int(model_config["hidden_size"]) // heads)
    return 2 * layers * kv_heads * head_dim * element_bytes


def kv_cache_bytes(model_config: Mapping[str, Any], *, max_num_seqs: int, max_model_len: int,
                   element_bytes: int = 2) -> int:
    """The KV cache that holds ``max_num_seqs`` full-length sequences at once, in bytes.

    Sized at the widest element both arms may store (bfloat16: 2 bytes) and given to both arms alike: a
    candidate with an FP8 cache holds twice the tokens in the same bytes, which is its change, not the
    setting's.
    """
    if max_num_seqs < 1 or max_model_len < 1:
        raise ValueError(f"max_num_seqs {max_num_seqs} and max_model_len {max_model_len} must be positive")
    return max_num_seqs * max_model_len * kv_bytes_per_token(model_config, element_bytes)


def flag_value(command: list[str], flag: str) -> str | None:
    """The value after ``flag`` in an argv (``--flag value`` or ``--flag=value``), else None."""
    for i, arg in enumerate(command):
        if arg == flag and i + 1 < len(command):
            return command[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None
