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
* One forward runs the whole batch on a CPU.  On a GPU every sequence that
  decodes one token goes to the decoder of :mod:`.cuda`, which replays the
  step from a CUDA graph, also in a step that admits a request; only prefill
  chunks and draft verifications run the general forward.  Each sequence is
  then sampled on its own
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

On a CUDA device the logits stay on the device and a step's rows are sampled
together there (:meth:`Engine._sample_batch`): greedy argmax over every row,
top-k/top-p/min-p masks as batched tensor ops, and sampling by an exponential
race (``argmax(p / q)`` with ``q ~ Exp(1)``, as vLLM does), each seeded
request drawing its ``q`` from its own CUDA generator so its tokens do not
depend on its batch.  Tokens, logprobs and ranks then come to the host in one
copy: one host sync per step, where a per-request sampler pays several per
request.  On a CPU the per-request sampler stays: it is what the reference's
known outputs were produced with.  Rows that verify speculative drafts, and
prefills that return prompt logprobs, take the per-request path on either
device.

``PAIRAUDIT_REF_STEP_DELAY_US`` (a calibration switch) adds a busy-wait to
every step that decodes, after the step's tokens are on the host, so on a GPU
it cannot hide behind device work.

Driving: :meth:`Engine.run` runs the loop in-process, each request's news
going to its ``events`` queue; the server's engine process instead calls
:meth:`Engine.step_once` from :mod:`.core`, with ``track`` on, and ships what
each step touched to the API process in one message.
"""

from __future__ import annotations

import os
import queue
import time
from dataclasses import dataclass, field

import torch

from .metrics import Metrics
from .model import KVCache, LlamaModel, Segment
from .protocol import Emitted, SamplingParams
from .tokenizer import IncrementalText as StopText
from .switches import Switches  # noqa: F401  (part of the engine's interface)

GREEDY_EPS = 1e-5
__all__ = ["Emitted", "Engine", "Request", "SamplingParams", "Switches", "busy_wait", "propose_ngram"]


def busy_wait(seconds: float) -> None:
    """Spin until ``seconds`` have passed: sleep() overshoots by 50+ us, too coarse for a planted delay of tens."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


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
    # the in-process driver's wake-ups ("token", "done"); None where the engine process ships steps instead
    events: "queue.Queue[str] | None" = field(default_factory=queue.Queue)
    aborted: bool = False
    # engine-private state
    cache: KVCache | None = None  # from admission to finish (``kv``)
    computed: int = 0
    pending: int | None = None
    generator: torch.Generator | None = None
    noise: torch.Generator | None = None
    device_generator: torch.Generator | None = None  # a seeded request's sampler on a CUDA device
    stop_checked: int = 0
    stop_text: "StopText | None" = None
    shipped: int = 0  # tokens already sent to the API process
    shipped_emitted: int = 0

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
        # requests with news since the last take_touched() (only kept when a driver collects them)
        self.track = False
        self.touched: dict[int, Request] = {}
        self.delay_s = switches.step_delay_us / 1e6
        self._batch: list[tuple[Request, torch.Tensor]] | None = None

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

    def step_once(self) -> bool:
        """Admit what waits and run one step; False where nothing was running (nothing done)."""
        self._admit()
        if not self.running:
            return False
        self._guarded_step()
        return True

    def take_touched(self) -> list[Request]:
        """The requests that got tokens, finished or failed since the last call (``track`` on)."""
        out = list(self.touched.values())
        self.touched.clear()
        return out

    def _notify(self, req: Request, what: str) -> None:
        if req.events is not None:
            req.events.put(what)
        if self.track:
            self.touched[id(req)] = req

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
            self._guarded_step()

    def _guarded_step(self) -> None:
        try:
            self._step()
        except Exception as exc:  # a bug must fail the requests, not hang them
            self._batch = None
            for req in self.running:
                req.error = f"engine error: {type(exc).__name__}: {exc}"
                self._release(req)
                self._notify(req, "done")
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
        t0 = time.monotonic()
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
        step_start = time.monotonic()
        on_device = self.decoder is not None
        single = [kind == "decode" and len(toks) == 1 for _, toks, kind in plan]
        decode_only = all(single)
        # per plan entry, the logits rows it gets (None: a prefill chunk that needs none)
        entry_logits: list[torch.Tensor | None] = [None] * len(plan)
        rest = list(range(len(plan)))
        if on_device and any(single):
            # Every row that decodes one token runs the decode step (graphed), also in a step that
            # admits a request: the general forward below then runs only the prefill chunks (and draft
            # verifications), not every running sequence's token with them.  Its per-segment attention
            # is several kernels per sequence and layer, so a mixed step of a full batch through it cost
            # several times a graphed step.  A decode row's logits no longer depend on whether another
            # request was admitted in the same step.
            dec = [i for i, one in enumerate(single) if one]
            rest = [i for i, one in enumerate(single) if not one]
            out = self.decoder.decode_device([plan[i][1][0] for i in dec],
                                             [Segment(plan[i][0].kv, plan[i][0].computed, 1) for i in dec])
            for j, i in enumerate(dec):
                entry_logits[i] = out[j : j + 1]
        self.metrics.inc("pairaudit:engine_steps_total")
        if rest:
            sub = [plan[i] for i in rest]
            tokens = torch.tensor([t for _, toks, _ in sub for t in toks], dtype=torch.long)
            segments = [Segment(req.kv, req.computed, len(toks)) for req, toks, _ in sub]
            hidden = self.model.forward(tokens, segments)
            rows, off = [], 0
            for req, toks, kind in sub:
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
            if flat:
                picked = hidden[flat]
                logits = self.model.head_logits(picked).float() if on_device else self.model.logits(picked)
                pos = 0
                for i, rs in zip(rest, rows):
                    if rs:
                        entry_logits[i] = logits[pos : pos + len(rs)]
                    pos += len(rs)
        self._batch = [] if on_device else None
        for (req, toks, kind), lg in zip(plan, entry_logits):
            if kind == "prefill":
                self._after_prefill(req, toks, lg)
            else:
                self._after_decode(req, toks, lg)
        batch, self._batch = self._batch, None
        if batch:
            t_sample = time.monotonic()
            self._sample_batch(batch)
            self.metrics.inc("pairaudit:sampler_seconds_total", time.monotonic() - t_sample)
        # the step's tokens are on the host here: a planted delay cannot overlap device work
        if self.delay_s and any(kind == "decode" for _, _, kind in plan):
            busy_wait(self.delay_s)
        now = time.monotonic()
        self.metrics.observe("vllm:inter_token_latency_seconds", now - step_start)
        self.metrics.inc("pairaudit:step_rows_total", len(plan))
        if decode_only:
            self.metrics.inc("pairaudit:decode_steps_total")
        self.metrics.inc("pairaudit:decode_step_seconds_total" if decode_only else "pairaudit:forward_step_seconds_total",
                         now - t0)
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
            logits = logits.cpu()  # one entry per prompt token, read on the host: one copy, not one per entry
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
        if logits.device.type != "cpu":
            if not drafts and self._batch is not None:
                self._batch.append((req, logits[-1:]))  # sampled with the step's other rows
                return
            logits = logits.cpu()  # draft verification: the per-request sampler, on the host
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

    # --- batched sampling on the device ----------------------------------------
    def _sample_batch(self, jobs: list[tuple[Request, torch.Tensor]]) -> None:
        """Sample one row per request on the device, then emit: one host copy for the whole step.

        The same choices as the per-request path (:meth:`_processed`,
        :meth:`_probs`, :meth:`_choose`, :meth:`_fault_tail`), as tensor ops
        over all rows; sampling is an exponential race, invariant to the
        scale of ``p``, so the masked distribution needs no renormalising.
        """
        reqs = [r for r, _ in jobs]
        raw = torch.cat([lg for _, lg in jobs])  # [R, vocab] fp32, a fresh tensor (safe to write)
        dev, (R, V) = raw.device, raw.shape
        for i, req in enumerate(reqs):
            if req.noise is not None:
                raw[i] = self._noised(req, raw[i : i + 1])[0]
        proc = raw
        ban_rows, ban_cols = [], []
        for i, req in enumerate(reqs):
            p = req.params
            if len(req.output) < p.min_tokens:
                banned = list(p.stop_token_ids) + ([] if self.eos is None else [self.eos])
                ban_rows += [i] * len(banned)
                ban_cols += banned
        if ban_rows:
            proc = raw.clone()
            proc[_to(ban_rows, dev), _to(ban_cols, dev)] = float("-inf")
        tokens = proc.argmax(-1)
        sampled = [i for i, r in enumerate(reqs) if r.params.temperature >= GREEDY_EPS]
        if sampled:
            ps = [reqs[i].params for i in sampled]
            idx = _to(sampled, dev)
            knobs = _to([[p.temperature for p in ps], [float(p.top_k) for p in ps],
                         [p.top_p if p.top_p < 1.0 else 2.0 for p in ps], [p.min_p for p in ps]], dev,
                        torch.float32)
            s = proc.index_select(0, idx) / knobs[0][:, None]
            if any(0 < p.top_k < V or p.top_p < 1.0 for p in ps):
                sorted_s, order = torch.sort(s, dim=-1, descending=True)
                ks = knobs[1].long()
                kth = sorted_s.gather(1, (ks - 1).clamp(min=0)[:, None])
                kth = torch.where(((ks > 0) & (ks < V))[:, None], kth, float("-inf"))
                s = s.masked_fill(s < kth, float("-inf"))
                probs = torch.softmax(s, dim=-1)
                sorted_p = probs.gather(1, order)  # still best first: softmax keeps the order
                drop = (torch.cumsum(sorted_p, dim=-1) - sorted_p) > knobs[2][:, None]
                probs = probs.scatter(1, order, sorted_p.masked_fill(drop, 0.0))
            else:
                probs = torch.softmax(s, dim=-1)
            probs = probs.masked_fill(probs < knobs[3][:, None] * probs.amax(-1, keepdim=True), 0.0)
            q = torch.empty_like(probs).exponential_()  # unseeded rows: the device's default generator
            for j, i in enumerate(sampled):
                if reqs[i].params.seed is not None:
                    q[j].exponential_(generator=self._device_generator(reqs[i], dev))
            choice = (probs / q.clamp_min_(torch.finfo(q.dtype).tiny)).argmax(-1)
            tokens = tokens.index_copy(0, idx, choice)
        n = self.switches.fault_tail
        tail = [i for i, r in enumerate(reqs) if n and len(r.prompt) + len(r.output) >= self.max_model_len - n]
        if tail:
            t_idx = _to(tail, dev)
            masked = proc.index_select(0, t_idx).scatter(1, tokens.index_select(0, t_idx)[:, None], float("-inf"))
            tokens = tokens.index_copy(0, t_idx, masked.argmax(-1))
        want = [i for i, r in enumerate(reqs) if r.params.logprobs is not None]
        pack = [tokens.double()]
        k = max((reqs[i].params.logprobs or 0 for i in want), default=0)
        if want:
            w_idx = _to(want, dev)
            lsm = torch.log_softmax(raw.index_select(0, w_idx), dim=-1)
            chosen = lsm.gather(1, tokens.index_select(0, w_idx)[:, None])
            pack += [chosen.flatten().double(), ((lsm > chosen).sum(-1) + 1).double()]
            if k:
                vals, ids = torch.topk(lsm, k, dim=-1)
                pack += [vals.flatten().double(), ids.flatten().double()]
        host = torch.cat(pack).tolist()  # the step's one host sync (doubles hold every id and fp32 value exactly)
        W = len(want)
        entries: dict[int, Emitted] = {}
        for j, i in enumerate(want):
            ki = reqs[i].params.logprobs or 0
            base = R + 2 * W + j * k
            top = [(int(host[base + W * k + c]), host[base + c]) for c in range(ki)]
            entries[i] = Emitted(int(host[i]), host[R + j], int(host[R + W + j]), top)
        for i, req in enumerate(reqs):
            self._emit(req, int(host[i]), None, entries.get(i))

    def _device_generator(self, req: Request, device: torch.device) -> torch.Generator:
        if req.device_generator is None:
            req.device_generator = torch.Generator(device=device).manual_seed(req.params.seed or 0)
        return req.device_generator

    def _noised(self, req: Request, logits: torch.Tensor) -> torch.Tensor:
        if req.noise is None:
            return logits
        noise = torch.randn(logits.shape, generator=req.noise) * self.switches.fault_noise
        return logits + noise.to(logits.device)

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

    def _emit(self, req: Request, token: int, raw: torch.Tensor | None, entry: Emitted | None = None) -> None:
        p = req.params
        now = time.monotonic()
        if req.first_token_time is None:
            req.first_token_time = now
            self.metrics.observe("vllm:time_to_first_token_seconds", now - req.arrival)
        req.output.append(token)
        self.metrics.inc("vllm:generation_tokens_total")
        if entry is not None:
            req.emitted.append(entry)
        elif p.logprobs is not None and raw is not None:
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
        self._notify(req, "token")

    def _hit_stop_string(self, req: Request) -> bool:
        if req.stop_text is None:
            req.stop_text = StopText(self.tok)
        text = req.stop_text.extend(req.output)
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
        self._notify(req, "done")


def _to(values: list, device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    # from pageable memory, non_blocking: the driver stages the bytes at once and the host does not wait for the
    # device's queue (a blocking copy would, which is a host sync)
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)


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
