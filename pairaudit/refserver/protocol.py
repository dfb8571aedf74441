"""What the reference server's two processes say to each other, importable without torch.

The API process (HTTP, tokenization, chat templates, streaming) and the engine
process (the model, the scheduler, sampling) talk over one duplex
``multiprocessing`` connection (a Unix socket pair), pickled tuples:

API -> engine
    ``(ADD, request_id, prompt_ids, SamplingParams, arrival)``: a new request;
    ``arrival`` is ``time.monotonic()`` in the API process (one clock for both
    processes on Linux), so TTFT and e2e latency still count from arrival.
    ``(ABORT, request_id)``: the client went away; the engine drops it.
    ``(METRICS, ticket)``: asks for a metrics snapshot.
    ``(CONFIG_OK,)``: the API process listens; the engine may start stepping.

engine -> API
    ``(CONFIG, facts)``: what the API process needs once the model is loaded.
    ``(STEP, [Update, ...])``: one message per engine step with every request
    that got tokens, finished or failed in that step (not one message per token
    per request: a step's cost to the engine is one pickle and one write).
    ``(METRICS, ticket, state)``: the engine's counters and histograms.

The API process, for its part, says ``(LISTENING, port)`` or
``(LISTEN_ERROR, message)`` once it has tried to bind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

ADD, ABORT, METRICS, CONFIG, CONFIG_OK, STEP, LISTENING, LISTEN_ERROR = (
    "add", "abort", "metrics", "config", "config_ok", "step", "listening", "listen_error")


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


class Update(NamedTuple):
    """One request's news from one engine step."""

    request_id: str
    tokens: list[int]  # the tokens emitted in this step (more than one with accepted drafts)
    emitted: list[Emitted]  # their logprob entries, for a request that asked for logprobs
    finish_reason: str | None
    stop_reason: int | str | None
    error: str | None
    prompt_logprobs: list[dict | None] | None  # sent once, with the request's first tokens

