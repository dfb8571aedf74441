"""The reference model's decode step on a CUDA device, captured in CUDA graphs.

Eager decode of a model this small is bound by the host launching kernels (a
30-layer step is several hundred launches), not by the GPU, and its speed
varies from run to run by far more than an audit's speed bar.  So, as vLLM
does, every pure decode step (each running sequence contributes exactly one
token, nothing is prefilling) runs one fixed sequence of kernels over static
buffers, which a ``torch.cuda.CUDAGraph`` captures once per shape and replays:

* KV cache: one pool per layer, ``[slots + 1, max_model_len, kv_heads,
  head_dim]``, zeroed once; a request holds one slot for its lifetime, and the
  extra slot takes the writes of the rows that pad a batch up to a captured
  size, so padding never touches a live cache.
* Inputs: one static ``[3, max batch]`` tensor (token, position, slot per row),
  filled from pinned host memory with one copy per step; the graph reads its
  first B columns.
* Attention over a static length: each row's keys are gathered up to a
  context bucket (a power of two >= 256, capped at ``max_model_len``) and the
  keys beyond the row's position get a bias of -30000 through one extra
  head-dim column (query 1, key 0 or -30000, padded to a multiple of 8).  That
  is a mask every SDPA backend runs -- flash attention takes no ``attn_mask`` --
  and adds exact zeros to every real score.
* Shapes: graphs for batch sizes 1, 2, 4, 8, ... up to ``--max-num-seqs``
  (a batch of 3 runs the graph of 4), one per context bucket, captured when a
  shape is first needed (after two warm-up runs on a side stream) and kept.

With ``PAIRAUDIT_REF_CUDA_GRAPHS=0`` the same step function runs eagerly at
the exact batch size: the same kernels, so at a captured batch size graphed
and eager decode give bitwise-equal logits.  Prefill chunks (and rows that
verify speculative drafts) run the model's general forward, eagerly, on views
of the same pool; in a step that has both, the sequences decoding one token
still take this step.
"""

from __future__ import annotations

import logging
import platform
from pathlib import Path

import torch
import torch.nn.functional as F

from .model import LlamaModel, Segment

log = logging.getLogger("refserver")

MASKED = -30000.0  # in bf16 and fp16 range; times 1/sqrt(64), exp() of it is exactly 0
BIAS_COLUMNS = 8  # the bias column padded so the head dim stays a multiple of 8
MIN_BUCKET = 256


def resolve_device(requested: str) -> str:
    """``cpu``, ``cuda`` or ``auto`` (CUDA where torch sees one) -> the device to serve on."""
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"--device cuda: torch {torch.__version__} sees no CUDA device "
                           f"(built for CUDA {torch.version.cuda}); allowed here: cpu, auto")
    if requested not in ("cpu", "cuda"):
        raise ValueError(f"--device {requested}: expected one of cpu, cuda, auto")
    return requested


def set_tf32(enabled: bool) -> None:
    """fp32 matmuls on CUDA in TF32 (``enabled``) or IEEE fp32, set explicitly either way."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):  # torch >= 2.9; mixing it with allow_tf32 is an error there
        matmul.fp32_precision = "tf32" if enabled else "ieee"
    else:
        matmul.allow_tf32 = enabled


def tf32_enabled() -> bool:
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        return matmul.fp32_precision == "tf32"
    return bool(matmul.allow_tf32)


def device_info(device: str) -> dict:
    """Which torch, CUDA and device the server runs on (for /version and the launch receipt)."""
    info = {"device": device, "torch": torch.__version__, "cuda": torch.version.cuda}
    if device == "cuda":
        i = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(i)
        info.update(device_name=props.name, compute_capability=f"{props.major}.{props.minor}",
                    device_memory_gib=round(props.total_memory / 2**30, 1),
                    cudnn=torch.backends.cudnn.version(), tf32_matmul=tf32_enabled())
    else:
        info["device_name"] = _cpu_name()
    return info


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def batch_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """Captured batch sizes: powers of two below ``max_num_seqs``, then ``max_num_seqs`` itself."""
    sizes, b = [], 1
    while b < max_num_seqs:
        sizes.append(b)
        b *= 2
    return (*sizes, max_num_seqs)


def context_buckets(max_model_len: int) -> tuple[int, ...]:
    sizes, b = [], MIN_BUCKET
    while b < max_model_len:
        sizes.append(b)
        b *= 2
    return (*sizes, max_model_len)


def _slot_of(cache: object) -> int:
    # a Segment is typed with model.KVCache; on this decoder every request's cache is a SlotCache (new_cache)
    if not isinstance(cache, SlotCache):
        raise TypeError(f"the CUDA decoder's segments carry its own SlotCache, got {type(cache).__name__}")
    return cache.slot


class SlotCache:
    """A request's KV cache: one slot of the decoder's pool (the interface of ``model.KVCache``)."""

    def __init__(self, pool_k: list[torch.Tensor], pool_v: list[torch.Tensor], slot: int):
        self.slot = slot
        self.length = 0
        self.k = [k[slot] for k in pool_k]  # [max_model_len, kv_heads, head_dim] views
        self.v = [v[slot] for v in pool_v]

    @property
    def capacity(self) -> int:
        return self.k[0].shape[0]

    def reserve(self, total: int) -> None:
        if total > self.capacity:  # the engine never schedules past max_model_len
            raise RuntimeError(f"KV slot of {self.capacity} positions cannot hold {total}")


class CudaDecoder:
    """Slots of a static KV pool, and the decode step over them: graphed, or eager at the exact batch size."""

    def __init__(self, model: LlamaModel, *, max_num_seqs: int, max_model_len: int, graphs: bool, metrics=None):
        # Eager, the same step runs on any device (the CPU tests drive the engine's GPU scheduling through
        # it); CUDA graphs and the pinned staging buffer that feeds them need a CUDA device.
        if graphs and model.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a model on a CUDA device, not {model.device}")
        cfg = model.cfg
        self.model, self.metrics, self.graphs_enabled = model, metrics, graphs
        self.max_model_len = max_model_len
        dev, dt = model.device, model.num.dtype
        self.scratch = max_num_seqs  # the slot padding rows write into
        shape = (max_num_seqs + 1, max_model_len, cfg.kv_heads, cfg.head_dim)
        # zeroed: a key or value never written (beyond a row's position) is masked, but NaN * 0 would still be NaN
        self.pool_k = [torch.zeros(shape, dtype=dt, device=dev) for _ in range(cfg.layers)]
        self.pool_v = [torch.zeros(shape, dtype=dt, device=dev) for _ in range(cfg.layers)]
        self.free_slots = list(range(max_num_seqs - 1, -1, -1))
        self.sizes = batch_sizes(max_num_seqs)
        self.buckets = context_buckets(max_model_len)
        self.static = torch.zeros((3, max_num_seqs), dtype=torch.long, device=dev)  # token, position, slot
        self.host = torch.zeros((3, max_num_seqs), dtype=torch.long)
        if graphs:
            self.host = self.host.pin_memory()
        self.positions = torch.arange(max_model_len, device=dev)
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.mempool = torch.cuda.graph_pool_handle() if graphs else None

    # --- slots ---------------------------------------------------------------
    def new_cache(self) -> SlotCache:
        if not self.free_slots:
            raise RuntimeError("no free KV slot (more running requests than --max-num-seqs)")
        return SlotCache(self.pool_k, self.pool_v, self.free_slots.pop())

    def free(self, cache: SlotCache | None) -> None:
        if cache is not None and cache.slot not in self.free_slots:
            self.free_slots.append(cache.slot)

    def describe(self) -> dict:
        return {"mode": "cuda_graphs" if self.graphs_enabled else "eager",
                "graph_batch_sizes": list(self.sizes) if self.graphs_enabled else [],
                "context_buckets": list(self.buckets), "kv_slots": self.scratch}

    # --- the step --------------------------------------------------------------
    def bucket(self, length: int) -> int:
        return next(b for b in self.buckets if b >= length)

    def decode(self, tokens: list[int], segments: list[Segment]) -> torch.Tensor:
        """fp32 logits [B, vocab] on the CPU for one new token per sequence, written at ``segment.start``."""
        return self.decode_device(tokens, segments).cpu()  # waits for the step

    def decode_device(self, tokens: list[int], segments: list[Segment]) -> torch.Tensor:
        """The same logits left on the device, the step queued and not waited for.

        Graphed, the result is a view of the graph's output: read it before the
        next step replays the graph.
        """
        B = len(tokens)
        positions = [s.start for s in segments]
        slots = [_slot_of(s.cache) for s in segments]
        lb = self.bucket(max(positions) + 1)
        if not self.graphs_enabled:
            static = torch.tensor([tokens, positions, slots], dtype=torch.long, device=self.model.device)
            return self._step(static[0], static[1], static[2], lb)
        bp = next(b for b in self.sizes if b >= B)
        # captured first: the capture's warm-up runs write the static inputs (with the spare slot)
        graph, out = self.graphs.get((bp, lb)) or self._capture(bp, lb)
        pad = bp - B
        self.host[:, :bp] = torch.tensor([tokens + [0] * pad, positions + [0] * pad, slots + [self.scratch] * pad])
        self.static.copy_(self.host, non_blocking=True)  # whole, contiguous: one DMA from pinned memory
        graph.replay()
        if self.metrics is not None:
            self.metrics.inc("pairaudit:decode_graph_replays_total")
        return out[:B]

    def _capture(self, bp: int, lb: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        # every row of the shape on the scratch slot: the warm-up runs really execute
        self.static[:, :bp] = torch.tensor([[0], [0], [self.scratch]], device=self.model.device)
        args = (self.static[0, :bp], self.static[1, :bp], self.static[2, :bp], lb)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # lazy initialisation (cuBLAS handles, workspaces) stays out of the capture
                self._step(*args)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool, capture_error_mode="thread_local"):
            out = self._step(*args)
        self.graphs[(bp, lb)] = (graph, out)
        if self.metrics is not None:
            self.metrics.inc("pairaudit:decode_graph_captures_total")
        log.info("captured the decode step for batch %d, context %d (%d graphs)", bp, lb, len(self.graphs))
        return graph, out

    @torch.inference_mode()
    def _step(self, tokens: torch.Tensor, pos: torch.Tensor, slot: torch.Tensor, lb: int) -> torch.Tensor:
        """One decode step on device tensors only (no host sync: CUDA graphs capture it); fp32 logits [B, vocab]."""
        m, cfg = self.model, self.model.cfg
        heads, kvh, hd = cfg.heads, cfg.kv_heads, cfg.head_dim
        qd, kd, group, half = heads * hd, kvh * hd, heads // kvh, hd // 2
        B = tokens.shape[0]
        ad = m.num.attn_dtype
        x = m.embed[tokens]
        cos = m.cos[pos][:, None, :]
        sin = m.sin_signed[pos][:, None, :]
        # the mask as a score bias through one extra head-dim column: key j of row b is seen iff j <= pos[b]
        bias = torch.where(self.positions[:lb][None, :] <= pos[:, None], 0.0, MASKED).to(ad)
        key_pad = torch.zeros((B, kvh, lb, BIAS_COLUMNS), dtype=ad, device=x.device)
        key_pad[..., 0] = bias[:, None, :]
        query_pad = torch.zeros((B, kvh, group, BIAS_COLUMNS), dtype=ad, device=x.device)
        query_pad[..., 0] = 1.0
        value_pad = torch.zeros((B, kvh, lb, BIAS_COLUMNS), dtype=ad, device=x.device)
        with m.num.sdpa_context():
            for li, layer in enumerate(m.layers):
                qkv = layer.qkv(m._rms(x, layer.in_norm))
                qk = qkv[:, : qd + kd].view(B, heads + kvh, hd)
                qk = qk * cos + qk.roll(half, -1) * sin
                q, k = qk[:, :heads], qk[:, heads:]
                v = qkv[:, qd + kd :].view(B, kvh, hd)
                pk, pv = self.pool_k[li], self.pool_v[li]
                pk.index_put_((slot, pos), k)
                pv.index_put_((slot, pos), v)
                keys = pk[:, :lb].index_select(0, slot).transpose(1, 2).to(ad)  # [B, kv, lb, hd]
                values = pv[:, :lb].index_select(0, slot).transpose(1, 2).to(ad)
                # GQA: the query heads of each KV group are that group's query rows (one token per sequence)
                o = F.scaled_dot_product_attention(
                    torch.cat([q.reshape(B, kvh, group, hd).to(ad), query_pad], -1),
                    torch.cat([keys, key_pad], -1),
                    torch.cat([values, value_pad], -1),
                    scale=m.scale,
                )
                x = x + layer.o(o[..., :hd].reshape(B, qd).to(x.dtype))
                x = x + m._mlp(x, layer)
            return m.head_logits(m._rms(x, m.norm)).float()
