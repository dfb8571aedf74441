"""The engine's GPU scheduling, driven on this CPU through the decoder's eager step.

On a GPU every sequence that decodes one token runs the decoder's step (a
static KV pool, replayed from a CUDA graph), also in a step that admits a
request; only prompt chunks go through the model's general forward, whose
attention runs per sequence. Without CUDA graphs the decoder's step is plain
torch and runs here, so the scheduling is checked in CI, where no GPU is.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from pairaudit.refserver.cuda import CudaDecoder
from pairaudit.refserver.engine import Engine, Request, Switches
from pairaudit.refserver.metrics import Metrics
from pairaudit.refserver.model import LlamaModel
from pairaudit.refserver.numerics import Numerics
from pairaudit.refserver.protocol import SamplingParams
from pairaudit.refserver.tokenizer import ChatTokenizer
from pairaudit.serving.modelstore import resolve_model

PROMPTS = ["Hello there", "What is 2+2?", "Name a color.", "Count to five."]
MAX_MODEL_LEN = 512


@pytest.fixture(scope="module")
def model_and_tokenizer():
    torch.set_num_threads(1)
    path, _ = resolve_model("SmolLM2-135M-Instruct")
    model = LlamaModel(path, numerics=Numerics.from_switches(Switches.from_env(), "float32"), device="cpu")
    return model, ChatTokenizer(path)


def run_engine(model, tok, *, stagger_s: float, decoder: bool):
    """Four greedy requests, submitted together or one every ``stagger_s`` (so later ones are admitted while
    earlier ones decode); their tokens and the engine's step counters."""
    metrics = Metrics("test")
    dec = CudaDecoder(model, max_num_seqs=4, max_model_len=MAX_MODEL_LEN, graphs=False) if decoder else None
    eng = Engine(model, tok, max_model_len=MAX_MODEL_LEN, switches=Switches.from_env(), metrics=metrics,
                 max_num_seqs=4, decoder=dec)
    worker = threading.Thread(target=eng.run)
    worker.start()
    reqs = []
    try:
        for text in PROMPTS:
            reqs.append(eng.submit(Request(prompt=tok(text).input_ids,
                                           params=SamplingParams(max_tokens=12, temperature=0.0))))
            time.sleep(stagger_s)
        deadline = time.monotonic() + 300
        while not all(r.done for r in reqs) and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        eng.stopped = True
        worker.join()
    assert all(r.done and r.error is None for r in reqs), [r.error for r in reqs]
    return [r.output for r in reqs], metrics.state()["counters"]


def test_decoding_sequences_take_the_decode_step_when_a_request_is_admitted(model_and_tokenizer, monkeypatch):
    model, tok = model_and_tokenizer
    calls: list = []
    real = model.forward

    def spy(tokens, segments):  # the real forward; which segments it was given is noted
        calls.append([(s.start, s.n) for s in segments])
        return real(tokens, segments)

    with monkeypatch.context() as m:
        m.setattr(model, "forward", spy)
        staggered, counters = run_engine(model, tok, stagger_s=0.3, decoder=True)
    # later requests were admitted while earlier ones decoded: steps that prefilled and decoded at once
    assert counters["pairaudit:engine_steps_total"] > counters["pairaudit:decode_steps_total"] >= 1
    assert len(calls) == counters["pairaudit:engine_steps_total"] - counters["pairaudit:decode_steps_total"]
    # ... but the general forward only ever saw prompt chunks: no one-token segment past a prompt
    prompt_lens = {len(tok(t).input_ids) for t in PROMPTS}
    for segments in calls:
        for start, n in segments:
            assert start == 0 and n in prompt_lens, segments
    # where each request joined does not change what it decodes
    together, _ = run_engine(model, tok, stagger_s=0.0, decoder=True)
    assert staggered == together


def test_the_decoders_eager_step_decodes_what_the_cpu_engine_decodes(model_and_tokenizer):
    model, tok = model_and_tokenizer
    with_decoder, _ = run_engine(model, tok, stagger_s=0.3, decoder=True)
    plain, counters = run_engine(model, tok, stagger_s=0.3, decoder=False)
    assert counters["pairaudit:decode_graph_replays_total"] == 0
    assert with_decoder == plain
