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

Speed (a decode step streams every weight once, so it is bandwidth- and
dispatch-bound; see docs/reference-server-performance.md):

* Each weight is kept in two layouts, because MKL's single-row product is
  fastest against an ``[in, out]`` matrix while its few-row product is fastest
  as ``W @ x.T`` against ``[out, in]`` (measured: a 1-row step 47 vs 60 ms, a
  4-row step 81 vs 154 ms of CPU time).
* Decode attention is two batched matmuls and a softmax over the cache, grouped
  by KV head; ``scaled_dot_product_attention`` is kept for prefill chunks,
  where its blocking pays off.
* RoPE tables are computed once for every position; rotate-half uses a
  ``roll`` against a sine table with the sign folded in, which is bitwise the
  same as negating half of the input.
* The KV cache is position-major (``[capacity, kv_heads, head_dim]``) so a
  step's keys and values are written with one contiguous copy per sequence.

Devices, dtypes and switches (:mod:`.numerics`): the same forward runs on a
CUDA device and in bfloat16 or float16 (weights, activations and KV cache in
that dtype, every projection ``F.linear`` against ``[out, in]``).  The numeric
switches each change one place -- attention, MLP projections, RMSNorm, LM head,
the SDPA backend -- and with all of them at their rollback values a CPU fp32
model runs exactly the operations listed above.  On CUDA, decode steps take a
separate batched path (:mod:`.cuda`) that CUDA graphs can capture; the forward
here serves prefill chunks, speculative verify rows and steps that mix them
with decodes.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import math
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from pairaudit.core.artifacts import atomic_file
from pairaudit.refserver.numerics import BF16, CastLinear, Numerics, rms_norm_bf16
from pairaudit.serving.modelstore import cache_root

log = logging.getLogger("refserver")


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
    """One sequence's keys and values, position-major, grown geometrically as it lengthens."""

    def __init__(self, cfg: LlamaConfig, capacity: int = 256, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu"):
        self.cfg = cfg
        self.length = 0
        shape = (capacity, cfg.kv_heads, cfg.head_dim)
        self.k = [torch.empty(shape, dtype=dtype, device=device) for _ in range(cfg.layers)]
        self.v = [torch.empty(shape, dtype=dtype, device=device) for _ in range(cfg.layers)]

    @property
    def capacity(self) -> int:
        return self.k[0].shape[0]

    def reserve(self, total: int) -> None:
        if total <= self.capacity:
            return
        cap = max(total, 2 * self.capacity)
        for store in (self.k, self.v):
            for i, old in enumerate(store):
                new = torch.empty((cap, *old.shape[1:]), dtype=old.dtype, device=old.device)
                new[: self.length] = old[: self.length]
                store[i] = new


@dataclass
class Segment:
    """``n`` new tokens of one sequence, written at cache positions start..start+n-1."""

    cache: KVCache
    start: int
    n: int


class Linear:
    """A weight ``[out, in]`` kept in the layout each batch shape multiplies fastest.

    fp32 on a CPU: ``[in, out]`` for one row, ``W @ x.T`` for several.
    bfloat16 / float16 (the BF16 head, a reduced-precision model): ``F.linear``
    against ``[out, in]`` at every batch shape -- on a CPU without bf16
    instructions the ``[in, out]`` product falls to a slow path (measured on
    the 49152 x 576 head, AVX2: 423 ms per row against 6 ms).  On a GPU every
    dtype goes to cuBLAS through ``F.linear``.
    """

    def __init__(self, weight: torch.Tensor, transposed: torch.Tensor | None = None):
        self.w = weight.contiguous()  # [out, in]: W @ x.T for several rows
        self.direct = weight.dtype != torch.float32 or weight.device.type != "cpu"
        if self.direct:
            self.wt = None
        else:  # [in, out]: x @ W.T for one row
            self.wt = weight.t().contiguous() if transposed is None else transposed

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.direct:
            return F.linear(x, self.w)
        if x.shape[0] == 1:
            return x @ self.wt
        return (self.w @ x.t()).t().contiguous()


@dataclass
class _Layer:
    in_norm: torch.Tensor
    qkv: Linear
    o: Linear
    post_norm: torch.Tensor
    gate_up: Linear | CastLinear      # CastLinear: the MLP switch computes in bf16
    down: Linear | CastLinear


_LINEARS = ("qkv", "o", "gate_up", "down")


def layout_cache_path(weights_sha256: str) -> Path:
    """Where the served layout of the checkpoint with these weights is kept between starts."""
    return cache_root() / "layouts" / f"{weights_sha256}.{LAYOUT_ID}.pt"


def build_layout(path: Path, cfg: LlamaConfig) -> dict[str, torch.Tensor]:
    """Every tensor the model serves with, fp32, fused and in both product layouts (``<name>.t``: ``[in, out]``).

    Each per-layer kind is one tensor with the layers stacked first, so a kept
    file unpickles 15 tensors rather than 300 (0.1 s of a start).
    """
    weights = {}
    for f in sorted(path.glob("*.safetensors")):
        weights.update(load_file(f))
    w = {k.removeprefix("model."): v.float() for k, v in weights.items()}
    kinds: dict[str, list] = {name: [] for name in ("in_norm", "post_norm", *_LINEARS)}
    for i in range(cfg.layers):
        p = f"layers.{i}."
        kinds["in_norm"].append(w[p + "input_layernorm.weight"])
        kinds["post_norm"].append(w[p + "post_attention_layernorm.weight"])
        # q/k/v and gate/up fused: one weight stream per step instead of three/two
        kinds["qkv"].append(torch.cat([w[p + f"self_attn.{n}_proj.weight"] for n in ("q", "k", "v")], dim=0))
        kinds["o"].append(w[p + "self_attn.o_proj.weight"])
        kinds["gate_up"].append(torch.cat([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]], dim=0))
        kinds["down"].append(w[p + "mlp.down_proj.weight"])
    out = {name: torch.stack(parts) for name, parts in kinds.items()}
    for name in _LINEARS:
        out[name + ".t"] = out[name].transpose(1, 2).contiguous()
    # copied out of the mapped checkpoint, whose 16-byte offsets would change MKL's kernels (and bits)
    out["embed"], out["norm"] = w["embed_tokens.weight"].clone(), w["norm.weight"].clone()
    if "lm_head.weight" in w:  # untied; a tied head is the embedding itself
        out["head"] = w["lm_head.weight"].clone()
    out["head.t"] = out.get("head", out["embed"]).t().contiguous()
    return out


# Names the layout build_layout makes: a change to its code is a new kept file, never a stale one.
LAYOUT_ID = hashlib.sha256(inspect.getsource(build_layout).encode()).hexdigest()[:16]


def load_layout(path: Path, cfg: LlamaConfig, cache: Path | None = None) -> dict[str, torch.Tensor]:
    """The served layout, memory-mapped from ``cache`` when a complete one is there, else built (and kept there).

    Building it copies and transposes every weight (0.7 s of CPU time for the
    embedded model); mapping the kept file takes milliseconds, and servers of
    both arms share its pages.  torch's own format is used because it aligns
    every tensor to 64 bytes, so a mapped weight multiplies bit for bit as a
    freshly built one (safetensors' 16-byte offsets send MKL down another
    path).  A cache that cannot be written costs only speed.
    """
    if cache is not None and cache.is_file():
        try:
            kept = torch.load(cache, mmap=True, weights_only=True)
            if kept.get("layout") == LAYOUT_ID:
                return kept["tensors"]
            log.warning("rebuilding the served layout: %s holds layout %r, not %r", cache, kept.get("layout"),
                        LAYOUT_ID)
        except Exception as exc:  # any unreadable file is rebuilt: it is a cache, never the weights
            log.warning("rebuilding the served layout: %s unreadable (%s: %s)", cache, type(exc).__name__, exc)
    layout = build_layout(path, cfg)
    if cache is None:
        return layout
    try:
        # a concurrent start renames a complete file too; either one wins
        with atomic_file(cache, "wb") as f:
            torch.save({"layout": LAYOUT_ID, "tensors": layout}, f)
    except (OSError, RuntimeError) as exc:  # torch's writer reports a full disk as a RuntimeError
        log.warning("serving without a kept layout: cannot write %s (%s)", cache, exc)
        return layout
    # the same weights' layouts from earlier code, a gigabyte each (a server still mapping one keeps its pages)
    weights = cache.name.split(".", 1)[0]
    for old in cache.parent.glob(f"{weights}.*.pt"):
        if old != cache:
            old.unlink(missing_ok=True)
    return torch.load(cache, mmap=True, weights_only=True)["tensors"]


class LlamaModel:
    def __init__(self, path: Path, *, lm_head_bf16: bool = False, layout_cache: Path | None = None,
                 numerics: Numerics | None = None, device: torch.device | str = "cpu"):
        num = numerics or Numerics()
        if lm_head_bf16 and not num.lm_head_bf16:
            num = replace(num, lm_head_bf16=True)
        self.num = num
        self.device = dev = torch.device(device)
        self.gpu_attention = dev.type != "cpu"  # every attention through SDPA with GPU-runnable masks
        self.cfg = cfg = LlamaConfig.from_dir(path)
        t = load_layout(path, cfg, layout_cache)
        dt = num.dtype
        cpu = dev.type == "cpu"

        def put(w: torch.Tensor, dtype: torch.dtype = dt) -> torch.Tensor:
            return w.to(device=dev, dtype=dtype)  # the tensor itself where nothing changes (CPU fp32)

        def linear(name: str, i: int, dtype: torch.dtype) -> Linear:
            if cpu and dtype == torch.float32:  # the CPU reference: both product layouts, mapped as kept
                return Linear(t[name][i], t[name + ".t"][i])
            return Linear(put(t[name][i], dtype))

        norm_dtype = BF16 if num.rmsnorm_bf16 else dt
        self.embed = put(t["embed"])
        self.layers: list[_Layer] = []
        for i in range(cfg.layers):
            qkv, o = linear("qkv", i, dt), linear("o", i, dt)
            mlp: dict[str, Linear | CastLinear] = {}
            for name in ("gate_up", "down"):
                # the MLP switch: bf16 weights and inputs, the output back in the model dtype
                mlp[name] = (CastLinear(linear(name, i, BF16), BF16) if num.mlp_dtype != dt
                             else linear(name, i, dt))
            self.layers.append(_Layer(in_norm=put(t["in_norm"][i], norm_dtype),
                                      post_norm=put(t["post_norm"][i], norm_dtype), qkv=qkv, o=o,
                                      gate_up=mlp["gate_up"], down=mlp["down"]))
        self.norm = put(t["norm"], norm_dtype)
        self.lm_head_bf16 = num.lm_head_bf16
        head_dtype = num.head_dtype
        if cpu and head_dtype == torch.float32:
            self.head = Linear(t.get("head", t["embed"]), t["head.t"])
        elif "head" not in t and head_dtype == dt:  # tied, same dtype: the embedding's own storage
            self.head = Linear(self.embed)
        else:
            self.head = Linear(put(t.get("head", t["embed"]), head_dtype))
        self.scale = 1.0 / math.sqrt(cfg.head_dim)
        # rotary tables for every position, computed as transformers does (positions * inv_freq, then cos/sin)
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float() / cfg.head_dim))
        freqs = torch.arange(cfg.max_positions).float()[:, None] * inv[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        half = cfg.head_dim // 2
        sin = emb.sin()
        self.cos = emb.cos()
        # rotate_half(x) * sin == roll(x, half) * (sin with its first half negated), bit for bit
        self.sin_signed = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)
        if not (cpu and dt == torch.float32):  # computed in fp32, then in the model's dtype (as transformers does)
            self.cos, self.sin_signed = put(self.cos), put(self.sin_signed)

    def new_cache(self, capacity: int) -> KVCache:
        """A growable KV cache for one sequence in the model's dtype, on its device."""
        return KVCache(self.cfg, capacity, dtype=self.num.dtype, device=self.device)

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.num.rmsnorm_bf16:
            return rms_norm_bf16(x, weight, self.cfg.eps)
        return F.rms_norm(x, (x.shape[-1],), weight, self.cfg.eps)

    def _mlp(self, x: torch.Tensor, layer: _Layer) -> torch.Tensor:
        gu = layer.gate_up(self._rms(x, layer.post_norm))
        inter = gu.shape[-1] // 2
        return layer.down(F.silu(gu[:, :inter]) * gu[:, inter:])

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
                mask: torch.Tensor | None) -> torch.Tensor:
        """Attention of one sequence's new rows ``q`` [n, heads, hd] over its cached ``k``/``v`` [end, kv, hd].

        Returns [n, heads * hd] in the attention's dtype (the model's, or
        bfloat16 under the attention switch).
        """
        cfg = self.cfg
        heads, kvh, hd = cfg.heads, cfg.kv_heads, cfg.head_dim
        n, qd = q.shape[0], heads * hd
        ad = self.num.attn_dtype
        if ad != q.dtype:
            q, k, v = q.to(ad), k.to(ad), v.to(ad)
        if self.gpu_attention:
            return self._attend_gpu(q, k, v, start)
        if n == 1 and self.num.sdpa_backend == "auto":
            # [kv, group, hd] @ [kv, hd, L] -> softmax -> @ [kv, L, hd]
            qs = q[0].view(kvh, heads // kvh, hd)
            scores = torch.bmm(qs, k.permute(1, 2, 0)).mul_(self.scale)
            o = torch.bmm(scores.softmax(-1), v.transpose(0, 1))
            return o.view(1, qd)
        if n == 1:  # the same grouping, through the SDPA backend the switch names
            o = F.scaled_dot_product_attention(q[0].view(1, kvh, heads // kvh, hd), k.transpose(0, 1).unsqueeze(0),
                                               v.transpose(0, 1).unsqueeze(0), scale=self.scale)
            return o.view(1, qd)
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0),
            k.transpose(0, 1).unsqueeze(0),
            v.transpose(0, 1).unsqueeze(0),
            attn_mask=mask,
            is_causal=mask is None,
            enable_gqa=True,
        )
        return o[0].transpose(0, 1).reshape(n, qd)

    def _attend_gpu(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
        """``_attend`` on a GPU: every shape through SDPA, masks every backend can run.

        A chunk after the start of the sequence needs a causal mask aligned to
        the bottom right (row i sees keys up to start + i); ``causal_lower_right``
        is that mask in a form flash and memory-efficient attention accept
        (a boolean mask would rule flash out).  KV heads are repeated for the
        query heads rather than left to ``enable_gqa``, which not every backend
        takes.
        """
        from torch.nn.attention.bias import causal_lower_right

        cfg = self.cfg
        heads, kvh, hd = cfg.heads, cfg.kv_heads, cfg.head_dim
        n, group = q.shape[0], heads // kvh
        if n == 1:  # one row: the query heads of each KV group become its query rows, no mask
            o = F.scaled_dot_product_attention(q[0].view(1, kvh, group, hd), k.transpose(0, 1).unsqueeze(0),
                                               v.transpose(0, 1).unsqueeze(0), scale=self.scale)
            return o.reshape(1, heads * hd)
        kk = k.transpose(0, 1).repeat_interleave(group, dim=0).unsqueeze(0)
        vv = v.transpose(0, 1).repeat_interleave(group, dim=0).unsqueeze(0)
        qq = q.transpose(0, 1).unsqueeze(0)
        if start == 0:
            o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, scale=self.scale)
        else:
            o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=causal_lower_right(n, start + n),
                                               scale=self.scale)
        return o[0].transpose(0, 1).reshape(n, heads * hd)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, segments: list[Segment]) -> torch.Tensor:
        """Run the new tokens of every segment; return final hidden states [T, hidden].

        Writes each segment's keys/values into its cache; the caller decides how
        much of that to keep (``cache.length``), which is how rejected
        speculative tokens are dropped.
        """
        cfg = self.cfg
        heads, kvh, hd = cfg.heads, cfg.kv_heads, cfg.head_dim
        qd, kd = heads * hd, kvh * hd
        half = hd // 2
        cpu = self.device.type == "cpu"
        if len(segments) == 1:
            s = segments[0]
            positions = slice(s.start, s.start + s.n)
        else:
            positions = torch.cat([torch.arange(s.start, s.start + s.n) for s in segments])
            if not cpu:
                positions = positions.to(self.device)
        cos = self.cos[positions][:, None, :]
        sin = self.sin_signed[positions][:, None, :]
        plan = []  # per segment: (row slice, cache end, causal mask or None)
        off = 0
        for s in segments:
            s.cache.reserve(s.start + s.n)
            end = s.start + s.n
            mask = None
            if cpu and s.n > 1 and s.start > 0:  # (a GPU builds its own mask: _attend_gpu)
                mask = torch.arange(end)[None, :] <= torch.arange(s.start, end)[:, None]
            plan.append((s, off, off + s.n, end, mask))
            off += s.n
        T = off
        x = self.embed[tokens if cpu else tokens.to(self.device)]
        with self.num.sdpa_context():
            for li, layer in enumerate(self.layers):
                qkv = layer.qkv(self._rms(x, layer.in_norm))
                qk = qkv[:, : qd + kd].view(T, heads + kvh, hd)
                qk = qk * cos + qk.roll(half, -1) * sin
                q, k = qk[:, :heads], qk[:, heads:]
                v = qkv[:, qd + kd :].view(T, kvh, hd)
                outs = []
                for s, a, b, end, mask in plan:
                    kc, vc = s.cache.k[li], s.cache.v[li]
                    kc[s.start : end] = k[a:b]
                    vc[s.start : end] = v[a:b]
                    outs.append(self._attend(q[a:b], kc[:end], vc[:end], s.start, mask))
                attn = outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
                if attn.dtype != x.dtype:  # attention ran in bf16 under its switch
                    attn = attn.to(x.dtype)
                x = x + layer.o(attn)
                x = x + self._mlp(x, layer)
        return self._rms(x, self.norm)

    @torch.inference_mode()
    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits on the model's device in the head's dtype (real bfloat16 values under the BF16 head)."""
        dtype = self.num.head_dtype
        return self.head(hidden if hidden.dtype == dtype else hidden.to(dtype))

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits [rows, vocab] on the CPU, where sampling runs; on the BF16 grid when the head runs in bf16."""
        return self.head_logits(hidden).float().cpu()
