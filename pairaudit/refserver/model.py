"""A Llama-architecture forward pass built for continuous batching on a CPU.

Every engine step is one call of :meth:`LlamaModel.forward` over a *flattened*
list of new tokens from several sequences (prefill chunks, single decode
tokens, or 1+K speculative verify tokens), so the weight matmuls -- the
memory-bound part of a CPU decode step -- stream the weights once for the whole
batch.  Attention runs per sequence against that sequence's own KV cache, so
no sequence ever sees another's padding or positions.

Numerics: fp32 throughout.  With ``lm_head_bf16`` the LM head runs with
bfloat16 inputs and weights and returns bfloat16 logits (promoted to fp32 for
log-softmax and sampling), which puts every logit on the BF16 grid the way a
BF16 head does on a GPU.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file


@dataclass(frozen=True)
class LlamaConfig:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    vocab: int
    eps: float
    rope_theta: float
    max_positions: int

    @classmethod
    def from_dir(cls, path: Path) -> "LlamaConfig":
        c = json.loads((path / "config.json").read_text())
        if c.get("model_type") != "llama":
            raise ValueError(f"{path}: model_type {c.get('model_type')!r}; the reference server runs llama only")
        rope = c.get("rope_parameters") or {}
        hidden, heads = c["hidden_size"], c["num_attention_heads"]
        return cls(
            hidden=hidden,
            heads=heads,
            kv_heads=c.get("num_key_value_heads", heads),
            head_dim=c.get("head_dim", hidden // heads),
            layers=c["num_hidden_layers"],
            vocab=c["vocab_size"],
            eps=c["rms_norm_eps"],
            rope_theta=rope.get("rope_theta", c.get("rope_theta", 10000.0)),
            max_positions=c.get("max_position_embeddings", 2048),
        )


class KVCache:
    """One sequence's keys and values, grown geometrically as it lengthens."""

    def __init__(self, cfg: LlamaConfig, capacity: int = 256):
        self.cfg = cfg
        self.length = 0
        shape = (cfg.kv_heads, capacity, cfg.head_dim)
        self.k = [torch.empty(shape) for _ in range(cfg.layers)]
        self.v = [torch.empty(shape) for _ in range(cfg.layers)]

    @property
    def capacity(self) -> int:
        return self.k[0].shape[1]

    def reserve(self, total: int) -> None:
        if total <= self.capacity:
            return
        cap = max(total, 2 * self.capacity)
        for store in (self.k, self.v):
            for i, old in enumerate(store):
                new = torch.empty((old.shape[0], cap, old.shape[2]))
                new[:, : self.length] = old[:, : self.length]
                store[i] = new


@dataclass
class Segment:
    """``n`` new tokens of one sequence, written at cache positions start..start+n-1."""

    cache: KVCache
    start: int
    n: int


class LlamaModel:
    def __init__(self, path: Path, *, lm_head_bf16: bool = False):
        self.cfg = cfg = LlamaConfig.from_dir(path)
        weights = {}
        for f in sorted(path.glob("*.safetensors")):
            weights.update(load_file(f))
        w = {k.removeprefix("model."): v.float() for k, v in weights.items()}
        self.embed = w["embed_tokens.weight"]
        self.layers = []
        for i in range(cfg.layers):
            p = f"layers.{i}."
            self.layers.append(
                {
                    "in_norm": w[p + "input_layernorm.weight"],
                    # q/k/v and gate/up fused: one weight stream per step instead of three/two
                    "qkv": torch.cat(
                        [w[p + f"self_attn.{n}_proj.weight"] for n in ("q", "k", "v")], dim=0
                    ).contiguous(),
                    "o": w[p + "self_attn.o_proj.weight"],
                    "post_norm": w[p + "post_attention_layernorm.weight"],
                    "gate_up": torch.cat(
                        [w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]], dim=0
                    ).contiguous(),
                    "down": w[p + "mlp.down_proj.weight"],
                }
            )
        self.norm = w["norm.weight"]
        head = weights.get("lm_head.weight")
        head = self.embed if head is None else head.float()
        self.lm_head_bf16 = lm_head_bf16
        self.head = head.to(torch.bfloat16) if lm_head_bf16 else head
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float() / cfg.head_dim))
        self.inv_freq = inv

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return weight * (x * torch.rsqrt(var + self.cfg.eps))

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos(), emb.sin()

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rot * sin

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, segments: list[Segment]) -> torch.Tensor:
        """Run the new tokens of every segment; return final hidden states [T, hidden].

        Writes each segment's keys/values into its cache; the caller decides how
        much of that to keep (``cache.length``), which is how rejected
        speculative tokens are dropped.
        """
        cfg = self.cfg
        positions = torch.cat([torch.arange(s.start, s.start + s.n) for s in segments])
        cos, sin = self._rope(positions)
        cos, sin = cos[:, None, :], sin[:, None, :]
        for s in segments:
            s.cache.reserve(s.start + s.n)
        masks = []
        for s in segments:
            if s.n == 1:
                masks.append(None)
            else:
                q_pos = torch.arange(s.start, s.start + s.n)[:, None]
                masks.append(torch.arange(s.start + s.n)[None, :] <= q_pos)
        x = self.embed[tokens]
        qd, kd = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        for li, layer in enumerate(self.layers):
            h = self._rms(x, layer["in_norm"])
            qkv = h @ layer["qkv"].T
            q = qkv[:, :qd].view(-1, cfg.heads, cfg.head_dim)
            k = qkv[:, qd : qd + kd].view(-1, cfg.kv_heads, cfg.head_dim)
            v = qkv[:, qd + kd :].view(-1, cfg.kv_heads, cfg.head_dim)
            q = self._rotate(q, cos, sin)
            k = self._rotate(k, cos, sin)
            outs = []
            off = 0
            for s, mask in zip(segments, masks):
                end = s.start + s.n
                kc, vc = s.cache.k[li], s.cache.v[li]
                kc[:, s.start : end] = k[off : off + s.n].transpose(0, 1)
                vc[:, s.start : end] = v[off : off + s.n].transpose(0, 1)
                qs = q[off : off + s.n].transpose(0, 1).unsqueeze(0)
                o = F.scaled_dot_product_attention(
                    qs, kc[:, :end].unsqueeze(0), vc[:, :end].unsqueeze(0), attn_mask=mask, enable_gqa=True
                )
                outs.append(o[0].transpose(0, 1).reshape(s.n, qd))
                off += s.n
            attn = outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
            x = x + attn @ layer["o"].T
            h = self._rms(x, layer["post_norm"])
            gu = h @ layer["gate_up"].T
            inter = gu.shape[-1] // 2
            x = x + (F.silu(gu[:, :inter]) * gu[:, inter:]) @ layer["down"].T
        return self._rms(x, self.norm)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits [rows, vocab]; on the BF16 grid when the head runs in bf16."""
        if self.lm_head_bf16:
            return (hidden.to(torch.bfloat16) @ self.head.T).float()
        return hidden @ self.head.T
