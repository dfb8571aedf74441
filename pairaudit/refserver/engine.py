"""The reference server's engine: continuous batching, sampling, n-gram speculation, faults.

Scheduling (one engine loop in the main thread; HTTP handler threads only enqueue and wait):

* Requests are admitted first-come first-served while fewer than
  ``max_num_seqs`` are running.
* Every step builds one flattened batch under a token budget
  (``max_num_batched_tokens``): each running sequence in decode contributes
  its pending token (plus up to K n-gram draft tokens when speculation is on),
  and sequences still in prefill contribute a chunk of their prompt from what
  budget is left (chunked prefill, as vLLM does), so a long prompt never stalls
  the decodes already in flight for more than one chunk.
* One forward runs the whole batch (on a GPU, a step where every sequence
  decodes one token goes to the decoder of :mod:`.cuda` instead, which replays
  it from a CUDA graph); each sequence is then sampled on its own
  rows with its own seeded generator, so what it gets does not depend on who
  it was batched with -- up to the numerics of the batch shape (a 1-row matmul
  and an N-row matmul round differently on a CPU, just as on a GPU).

Sampling follows vLLM: raw logprobs are the log-softmax of the raw logits
(before temperature, top-k/p, min-p); ``temperature == 0`` is greedy argmax;
``min_tokens`` masks EOS and stop tokens until reached.  Speculative
verification of a deterministic n-gram draft accepts draft token ``d`` with
probability ``p(d)`` and on rejection samples from ``p`` with ``d`` removed,
which leaves the target distribution unchanged; greedy accepts while the draft
equals the argmax.
"""

from __future__ import annotations

import os
import queue
import time
from dataclasses import dataclass, field

import torch

from .metrics import Metrics
from .model import KVCache, LlamaModel, Segment
from .switches import Switches  # noqa: F401  (part of the engine's interface)

GREEDY_EPS = 1e-5


@dataclass
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None


@dataclass
class Emitted:
    token: int
    logprob: float
    rank: int
    top: list[tuple[int, float]]  # (token id, logprob), best first


@dataclass
class Request:
    prompt: list[int]
    params: SamplingParams
    request_id: str = ""
    arrival: float = field(default_factory=time.monotonic)
    output: list[int] = field(default_factory=list)
    emitted: list[Emitted] = field(default_factory=list)
    prompt_logprobs: list[dict | None] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    error: str | None = None
    first_token_time: float | None = None
    scheduled_time: float | None = None
    finish_time: float | None = None
    events: "queue.Queue[str]" = field(default_factory=queue.Queue)
    aborted: bool = False
    # engine-private state
    cache: KVCache | None = None  # from admission to finish (``kv``)
    computed: int = 0
    pending: int | None = None
    generator: torch.Generator | None = None
    noise: torch.Generator | None = None
    stop_checked: int = 0

    @property
    def done(self) -> bool:
        return self.finish_reason is not None or self.error is not None

    @property
    def kv(self) -> KVCache:
        """The cache of a request being run (a request is given one when admitted and loses it when finished)."""
        if self.cache is None:
            raise RuntimeError(f"request {self.request_id}: no KV cache (not admitted, or already finished)")
        return self.cache


class Engine:
    def __init__(
        self,
        model: LlamaModel,
        tokenizer,
        *,
        max_model_len: int,
        switches: Switches,
        metrics: Metrics,
        max_num_seqs: int = 8,
        max_num_batched_tokens: int = 512,
        decoder=None,
    ):
        self.model = model
        # on a GPU: the KV slots and the (graphed) decode step, a cuda.CudaDecoder; None on a CPU
        self.decoder = decoder
        self.tok = tokenizer
        self.max_model_len = max_model_len
        self.switches = switches
        self.metrics = metrics
        self.max_num_seqs = max_num_seqs
        self.budget = max_num_batched_tokens
        self.eos = tokenizer.eos_token_id
        self.vocab = model.cfg.vocab
        self.waiting: "queue.Queue[Request]" = queue.Queue()
        self.running: list[Request] = []
        self.stopped = False
        self.alive = False

    # --- public -----------------------------------------------------------
    def run(self) -> None:
        """Run the engine loop in the calling thread until ``stopped``.

        Call it from the main thread: on this CPU the same torch matmuls run
        ~20 % slower from a secondary thread (measured: 68 vs 55 tok/s at batch
        4), so the HTTP server is the one that goes to a background thread.
        """
        self.alive = True
        try:
            self._loop()
        finally:
            self.alive = False

    def submit(self, req: Request) -> Request:
        p = req.params
        if p.seed is not None:
            req.generator = torch.Generator().manual_seed(p.seed)
        else:
            req.generator = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
        # The planted nondeterministic-argmax defect (a batch-variant reduction
        # that flips near-ties) touches greedy requests only: seeded sampled
        # requests stay reproducible, so the preflight's seeded_repeat passes
        # and the defect is left for the determinism repeats to find.
        if self.switches.fault_noise and p.temperature < GREEDY_EPS:
            req.noise = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
        if p.prompt_logprobs is not None:
            req.prompt_logprobs = [None]
        self.waiting.put(req)
        return req

    def abort(self, req: Request) -> None:
        req.aborted = True

    # --- loop -------------------------------------------------------------
    def _loop(self) -> None:
        while not self.stopped:
            self._admit()
            if not self.running:
                try:
                    req = self.waiting.get(timeout=0.05)
                except queue.Empty:
                    continue
                self._start(req)
            try:
                self._step()
            except Exception as exc:  # a bug must fail the requests, not hang them
                for req in self.running:
                    req.error = f"engine error: {type(exc).__name__}: {exc}"
                    self._release(req)
                    req.events.put("done")
                self.running = []
            self.metrics.set_queue(len(self.running), self.waiting.qsize())

    def _admit(self) -> None:
        while len(self.running) < self.max_num_seqs:
            try:
                req = self.waiting.get_nowait()
            except queue.Empty:
                return
            self._start(req)

    def _start(self, req: Request) -> None:
        if self.decoder is not None:
            req.cache = self.decoder.new_cache()
        else:
            req.cache = self.model.new_cache(min(self.max_model_len, len(req.prompt) + 64))
        req.scheduled_time = time.monotonic()
        self.running.append(req)

    def _release(self, req: Request) -> None:
        """Give a request's KV cache back (a GPU slot is reused by the next request)."""
        if self.decoder is not None:
            self.decoder.free(req.cache)
        req.cache = None

    def _step(self) -> None:
        for req in self.running:
            if req.aborted:
                self._release(req)
        self.running = [r for r in self.running if not r.aborted]
        budget = self.budget
        plan: list[tuple[Request, list[int], str]] = []  # (req, new tokens, kind)
        for req in self.running:
            if req.pending is not None:
                drafts = self._propose(req)
                plan.append((req, [req.pending, *drafts], "decode"))
                budget -= 1 + len(drafts)
        for req in self.running:
            if req.pending is None and budget > 0:
                chunk = req.prompt[req.computed : req.computed + budget]
                plan.append((req, chunk, "prefill"))
                budget -= len(chunk)
        if not plan:
            return
        tokens = torch.tensor([t for _, toks, _ in plan for t in toks], dtype=torch.long)
        segments = [Segment(req.kv, req.computed, len(toks)) for req, toks, _ in plan]
        step_start = time.monotonic()
        if self.decoder is not None and all(kind == "decode" and len(toks) == 1 for _, toks, kind in plan):
            logits = self.decoder.decode([toks[0] for _, toks, _ in plan], segments)
            self.metrics.inc("pairaudit:engine_steps_total")
            rows = [[i] for i in range(len(plan))]
        else:
            hidden = self.model.forward(tokens, segments)
            self.metrics.inc("pairaudit:engine_steps_total")
            rows, off = [], 0
            for req, toks, kind in plan:
                n = len(toks)
                if kind == "decode":
                    rows.append(list(range(off, off + n)))
                else:
                    last = req.computed + n == len(req.prompt)
                    want = list(range(off, off + n)) if req.prompt_logprobs is not None else []
                    if last and (not want or want[-1] != off + n - 1):
                        want.append(off + n - 1)
                    rows.append(want)
                off += n
            flat = [r for rs in rows for r in rs]
            logits = self.model.logits(hidden[flat]) if flat else None
        now = time.monotonic()
        self.metrics.observe("vllm:inter_token_latency_seconds", now - step_start)
        pos = 0
        for (req, toks, kind), rs in zip(plan, rows):
            lg = logits[pos : pos + len(rs)] if rs and logits is not None else None
            pos += len(rs)
            if kind == "prefill":
                self._after_prefill(req, toks, lg)
            else:
                self._after_decode(req, toks, lg)
        for req in self.running:
            if req.done:
                self._finish(req)
        self.running = [r for r in self.running if not r.done]

    # --- prefill ----------------------------------------------------------
    def _after_prefill(self, req: Request, chunk: list[int], logits: torch.Tensor | None) -> None:
        start = req.computed
        req.computed += len(chunk)
        req.kv.length = req.computed
        self.metrics.inc("vllm:prompt_tokens_total", len(chunk))
        if req.prompt_logprobs is not None and logits is not None:
            k = req.params.prompt_logprobs or 0  # set: the request asked for prompt logprobs
            raw = torch.log_softmax(self._noised(req, logits), dim=-1)
            for i in range(len(chunk)):
                nxt = start + i + 1
                if nxt < len(req.prompt):
                    req.prompt_logprobs.append(self._logprob_entry(raw[i], req.prompt[nxt], k))
        if req.computed == len(req.prompt):
            if logits is None or req.scheduled_time is None:  # the last chunk always asks for its last row
                raise RuntimeError(f"request {req.request_id}: prefill ended without its last row or schedule time")
            self.metrics.observe("vllm:request_prefill_time_seconds", time.monotonic() - req.scheduled_time)
            self._emit_from_rows(req, [], logits[-1:])

    # --- decode -----------------------------------------------------------
    def _after_decode(self, req: Request, toks: list[int], logits: torch.Tensor) -> None:
        drafts = toks[1:]
        req.computed += 1  # the pending token is now in the cache
        req.kv.length = req.computed
        self._emit_from_rows(req, drafts, logits)

    def _emit_from_rows(self, req: Request, drafts: list[int], logits: torch.Tensor) -> None:
        """Sample (or verify drafts) on ``logits`` rows, emit tokens, update the cache length."""
        accepted = 0
        for i in range(logits.shape[0]):
            row = self._noised(req, logits[i : i + 1])[0]
            proc = self._processed(req, row)
            draft = drafts[i] if i < len(drafts) else None
            token = self._choose(req, proc, draft)
            token = self._fault_tail(req, proc, token)
            # raw logprobs cost a pass over the vocabulary: only for requests that asked for them
            raw = torch.log_softmax(row, dim=-1) if req.params.logprobs is not None else None
            self._emit(req, token, raw)
            if req.done or draft is None or token != draft:
                break
            accepted += 1
            # the accepted draft token is already in the cache at this position
            req.computed += 1
            req.kv.length = req.computed
        if drafts:
            self.metrics.inc("vllm:spec_decode_num_drafts_total")
            self.metrics.inc("vllm:spec_decode_num_draft_tokens_total", len(drafts))
            self.metrics.inc("vllm:spec_decode_num_accepted_tokens_total", accepted)
            for p in range(accepted):
                self.metrics.accepted_at(p)

    def _noised(self, req: Request, logits: torch.Tensor) -> torch.Tensor:
        if req.noise is None:
            return logits
        noise = torch.randn(logits.shape, generator=req.noise) * self.switches.fault_noise
        return logits + noise

    def _processed(self, req: Request, row: torch.Tensor) -> torch.Tensor:
        p = req.params
        if len(req.output) < p.min_tokens:
            row = row.clone()
            banned = list(p.stop_token_ids) + ([] if self.eos is None else [self.eos])
            row[banned] = float("-inf")
        return row

    def _probs(self, req: Request, row: torch.Tensor) -> torch.Tensor:
        p = req.params
        row = row / p.temperature
        if 0 < p.top_k < row.shape[-1]:
            kth = torch.topk(row, p.top_k).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        probs = torch.softmax(row, dim=-1)
        if p.top_p < 1.0:
            sorted_p, idx = torch.sort(probs, descending=True)
            cum = torch.cumsum(sorted_p, dim=-1)
            drop = (cum - sorted_p) > p.top_p  # keep the smallest prefix whose mass reaches top_p
            probs = probs.clone()
            probs[idx[drop]] = 0.0
        if p.min_p > 0.0:
            probs = probs.masked_fill(probs < p.min_p * probs.max(), 0.0)
        return probs / probs.sum()

    def _choose(self, req: Request, row: torch.Tensor, draft: int | None) -> int:
        if req.params.temperature < GREEDY_EPS:
            return int(torch.argmax(row))
        probs = self._probs(req, row)
        if draft is not None:
            u = torch.rand(1, generator=req.generator).item()
            if u < probs[draft].item():
                return draft
            probs = probs.clone()
            probs[draft] = 0.0
            if probs.sum() <= 0:
                return draft
            probs = probs / probs.sum()
        return int(torch.multinomial(probs, 1, generator=req.generator))

    def _fault_tail(self, req: Request, row: torch.Tensor, token: int) -> int:
        """Planted capacity-tail defect: near the end of the context the emitted token is the runner-up."""
        n = self.switches.fault_tail
        if not n:
            return token
        position = len(req.prompt) + len(req.output)
        if position < self.max_model_len - n:
            return token
        masked = row.clone()
        masked[token] = float("-inf")
        return int(torch.argmax(masked))

    def _logprob_entry(self, raw: torch.Tensor, token: int, k: int) -> dict:
        entry = {}
        if k:
            vals, ids = torch.topk(raw, k)
            for rank, (t, v) in enumerate(zip(ids.tolist(), vals.tolist()), start=1):
                entry[t] = (v, rank)
        if token not in entry:
            entry[token] = (raw[token].item(), int((raw > raw[token]).sum()) + 1)
        return entry

    def _emit(self, req: Request, token: int, raw: torch.Tensor | None) -> None:
        p = req.params
        now = time.monotonic()
        if req.first_token_time is None:
            req.first_token_time = now
            self.metrics.observe("vllm:time_to_first_token_seconds", now - req.arrival)
        req.output.append(token)
        self.metrics.inc("vllm:generation_tokens_total")
        if p.logprobs is not None and raw is not None:
            k = p.logprobs
            vals, ids = torch.topk(raw, k) if k else (torch.empty(0), torch.empty(0, dtype=torch.long))
            lp = raw[token].item()
            req.emitted.append(
                Emitted(token, lp, int((raw > raw[token]).sum()) + 1, list(zip(ids.tolist(), vals.tolist())))
            )
        req.pending = token
        if token == self.eos and not p.ignore_eos and len(req.output) > p.min_tokens - 1:
            req.finish_reason = "stop"
        elif token in p.stop_token_ids and len(req.output) > p.min_tokens - 1:
            req.finish_reason, req.stop_reason = "stop", token
        elif p.stop and len(req.output) >= p.min_tokens and self._hit_stop_string(req):
            req.finish_reason = "stop"
        elif len(req.output) >= p.max_tokens or len(req.prompt) + len(req.output) >= self.max_model_len:
            req.finish_reason = "length"
        req.events.put("token")

    def _hit_stop_string(self, req: Request) -> bool:
        text = self.tok.decode(req.output, skip_special_tokens=True)
        # only text that could newly contain a stop string is searched
        lo = max(0, req.stop_checked - max(len(s) for s in req.params.stop))
        for s in req.params.stop:
            if s and text.find(s, lo) >= 0:
                req.stop_reason = s
                return True
        req.stop_checked = len(text)
        return False

    def _propose(self, req: Request) -> list[int]:
        k = self.switches.spec_ngram
        if not k:
            return []
        room = min(
            req.params.max_tokens - len(req.output),
            self.max_model_len - len(req.prompt) - len(req.output),
        ) - 1
        k = min(k, room)
        if k <= 0:
            return []
        return propose_ngram(req.prompt + req.output, k)

    def _finish(self, req: Request) -> None:
        req.finish_time = time.monotonic()
        self._release(req)
        m = self.metrics
        if req.error is None:
            m.finish(str(req.finish_reason))  # done without an error: a finish reason is set
            m.observe("vllm:e2e_request_latency_seconds", req.finish_time - req.arrival)
            if req.first_token_time is not None:
                m.observe("vllm:request_decode_time_seconds", req.finish_time - req.first_token_time)
        req.events.put("done")


def propose_ngram(tokens: list[int], k: int, *, n_min: int = 2, n_max: int = 4) -> list[int]:
    """Prompt-lookup drafting: continue the latest earlier occurrence of the longest matching suffix."""
    length = len(tokens)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        suffix = tokens[-n:]
        for start in range(length - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                follow = tokens[start + n : start + n + k]
                if follow:
                    return follow
                break
    return []
