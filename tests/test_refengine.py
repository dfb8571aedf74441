"""The reference engine: switches, n-gram drafting, sampling filters; the model against transformers."""

from __future__ import annotations

import time

import pytest
import torch

from pairaudit.refserver.engine import Engine, Request, SamplingParams, Switches, propose_ngram


def test_switches_parse_and_report():
    s = Switches.from_env({"PAIRAUDIT_REF_LM_HEAD_BF16": "1", "PAIRAUDIT_REF_SPEC_NGRAM": "4",
                           "PAIRAUDIT_REF_FAULT_NOISE": "0.5"})
    assert s.lm_head_bf16 and s.spec_ngram == 4 and s.fault_noise == 0.5 and s.fault_tail == 0
    assert s.as_env()["PAIRAUDIT_REF_SPEC_NGRAM"] == "4"
    assert Switches.from_env({}) == Switches()
    with pytest.raises(ValueError, match="PAIRAUDIT_REF_SPEC_NGRAM"):
        Switches.from_env({"PAIRAUDIT_REF_SPEC_NGRAM": "four"})
    with pytest.raises(ValueError, match="must be >= 0"):
        Switches.from_env({"PAIRAUDIT_REF_FAULT_TAIL": "-1"})


def test_fault_noise_is_drawn_for_greedy_requests_only():
    import queue

    eng = Engine.__new__(Engine)
    eng.switches, eng.waiting = Switches(fault_noise=2.0), queue.Queue()
    greedy = eng.submit(Request(prompt=[1], params=SamplingParams(max_tokens=1, temperature=0.0)))
    sampled = eng.submit(Request(prompt=[1], params=SamplingParams(max_tokens=1, temperature=0.7, seed=3)))
    assert greedy.noise is not None and sampled.noise is None
    row = torch.zeros(8)
    assert torch.equal(eng._noised(sampled, row), row) and not torch.equal(eng._noised(greedy, row), row)
    eng.switches = Switches()
    assert eng.submit(Request(prompt=[1], params=SamplingParams(max_tokens=1, temperature=0.0))).noise is None


def test_ngram_proposes_the_continuation_of_the_latest_match():
    tokens = [1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    # suffix [1, 2, 3] last occurred at 6..8, followed by 7, 8
    assert propose_ngram(tokens, 2) == [7, 8]
    assert propose_ngram(tokens, 5) == [7, 8, 1, 2, 3]
    assert propose_ngram([5, 6, 7, 8], 3) == []  # no repeated suffix, no draft
    assert propose_ngram([4, 4], 3) == []  # a one-token match is too weak (n_min = 2)


def _engine_stub():
    eng = Engine.__new__(Engine)
    eng.eos = 0
    return eng


def test_sampling_filters_top_k_top_p_min_p():
    eng = _engine_stub()
    row = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    req = Request(prompt=[1], params=SamplingParams(max_tokens=1, temperature=1.0, top_k=2))
    assert torch.count_nonzero(eng._probs(req, row)) == 2
    req.params = SamplingParams(max_tokens=1, temperature=1.0, top_p=0.7)
    probs = eng._probs(req, row)
    assert probs[2] == 0 and probs[3] == 0 and probs[:2].sum() == pytest.approx(1.0)
    req.params = SamplingParams(max_tokens=1, temperature=1.0, min_p=0.5)
    probs = eng._probs(req, row)
    assert probs[1] > 0 and probs[2] == 0  # 0.15 < 0.5 * 0.5


def test_min_tokens_masks_eos_and_stop_tokens_until_reached():
    eng = _engine_stub()
    req = Request(prompt=[1], params=SamplingParams(max_tokens=5, min_tokens=2, stop_token_ids=(3,)))
    row = torch.zeros(5)
    masked = eng._processed(req, row)
    assert masked[0] == float("-inf") and masked[3] == float("-inf") and masked[1] == 0
    req.output = [1, 2]
    assert torch.equal(eng._processed(req, row), row)


def test_speculative_acceptance_keeps_the_target_distribution():
    # a deterministic draft d is accepted with probability p(d); on rejection the
    # token comes from p without d: overall P(token) must equal p
    eng = _engine_stub()
    p = torch.tensor([0.2, 0.5, 0.3])
    row = torch.log(p)
    counts = torch.zeros(3)
    for seed in range(4000):
        req = Request(prompt=[1], params=SamplingParams(max_tokens=1, temperature=1.0))
        req.generator = torch.Generator().manual_seed(seed)
        counts[eng._choose(req, row, draft=1)] += 1
    freq = counts / counts.sum()
    assert torch.allclose(freq, p, atol=0.03)


# --- the model against transformers (real weights, in process) ---------------------
PROMPTS = ["The three primary colors are", "One, two, three,", "The sky is", "def add(a, b):", "Water boils at"]
STEPS = 16


@pytest.fixture(scope="module")
def real():
    from pairaudit.refserver.model import LlamaModel
    from pairaudit.refserver.tokenizer import ChatTokenizer
    from pairaudit.serving.modelstore import EMBEDDED_NAME, resolve_model

    path, _ = resolve_model(EMBEDDED_NAME)
    return path, ChatTokenizer(path), LlamaModel(path)


def _greedy(model, prompts_ids, steps, capacity_slack=4):
    """Greedy decode of several sequences batched in one forward per step; per-sequence tokens and logits."""
    from pairaudit.refserver.model import KVCache, Segment

    # a small capacity makes the caches grow mid-run, so growth is exercised too
    caches = [KVCache(model.cfg, capacity=len(p) + capacity_slack) for p in prompts_ids]
    flat = torch.tensor([t for p in prompts_ids for t in p])
    hidden = model.forward(flat, [Segment(c, 0, len(p)) for c, p in zip(caches, prompts_ids)])
    last = torch.tensor([len(p) for p in prompts_ids]).cumsum(0) - 1
    logits = model.logits(hidden[last])
    for c, p in zip(caches, prompts_ids):
        c.length = len(p)
    tokens, rows = [[] for _ in prompts_ids], [[] for _ in prompts_ids]
    for _ in range(steps):
        nxt = logits.argmax(-1)
        for i in range(len(prompts_ids)):
            tokens[i].append(int(nxt[i]))
            rows[i].append(logits[i])
        hidden = model.forward(nxt, [Segment(c, c.length, 1) for c in caches])
        for c in caches:
            c.length += 1
        logits = model.logits(hidden)
    return tokens, [torch.stack(r) for r in rows]


@pytest.fixture(scope="module")
def transformers_logits(real):
    """Teacher-forced transformers logits over prompt + the reference model's greedy continuation."""
    transformers = pytest.importorskip("transformers")
    path, tok, model = real
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    out = {}
    for prompt in PROMPTS:
        ids = tok(prompt).input_ids
        tokens, logits = _greedy(model, [ids], STEPS)
        with torch.inference_mode():
            ref = hf(torch.tensor([ids + tokens[0]])).logits[0, len(ids) - 1 : len(ids) - 1 + STEPS]
        out[prompt] = (ids, tokens[0], logits[0], ref)
    return out


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_text_and_logits_match_transformers(transformers_logits, prompt):
    _, tokens, ours, ref = transformers_logits[prompt]
    # transformers' own greedy choice at every position is the token the reference model emitted
    assert ref.argmax(-1).tolist() == tokens
    # and the logits agree to fp32 reordering error (a wrong rotary position or mask is off by O(1))
    assert (ours - ref).abs().max().item() < 1e-3


def test_batched_decode_matches_solo(real, transformers_logits):
    _, _, model = real
    ids = [transformers_logits[p][0] for p in PROMPTS[:4]]
    tokens, logits = _greedy(model, ids, STEPS)
    for i, p in enumerate(PROMPTS[:4]):
        _, solo_tokens, solo_logits, _ = transformers_logits[p]
        assert tokens[i] == solo_tokens
        # a 4-row matmul rounds differently from a 1-row one, never by more than reordering error
        assert (logits[i] - solo_logits).abs().max().item() < 1e-3


def test_chunked_prefill_and_verify_rows_match_one_prefill(real):
    from pairaudit.refserver.model import KVCache, Segment

    _, tok, model = real
    ids = tok("Explain why the sky is blue, in three short sentences.").input_ids
    whole = KVCache(model.cfg, capacity=len(ids))
    full = model.logits(model.forward(torch.tensor(ids), [Segment(whole, 0, len(ids))]))
    # the same prompt in chunks of 5, 1 and the rest: later chunks attend through a causal mask at an offset
    parts = KVCache(model.cfg, capacity=4)
    cuts = [0, 5, 6, len(ids)]
    got = []
    for a, b in zip(cuts, cuts[1:]):
        got.append(model.logits(model.forward(torch.tensor(ids[a:b]), [Segment(parts, a, b - a)])))
        parts.length = b
    got = torch.cat(got)
    assert got.shape == full.shape
    assert torch.equal(got.argmax(-1), full.argmax(-1))
    # (a row that saw a later position, or missed an earlier chunk, would be off by far more)
    assert (got - full).abs().max().item() < 1e-3


def test_linear_layouts_agree_for_one_and_many_rows():
    from pairaudit.refserver.model import Linear

    torch.manual_seed(0)
    w = torch.randn(96, 40)
    lin = Linear(w)
    for rows in (1, 2, 5):
        x = torch.randn(rows, 40)
        got = lin(x)
        assert got.shape == (rows, 96) and got.is_contiguous()
        assert torch.allclose(got, x @ w.T, atol=1e-5)


def test_bf16_head_puts_every_logit_on_the_bf16_grid(real):
    from pairaudit.refserver.model import KVCache, LlamaModel, Segment

    path, tok, fp32 = real
    bf16 = LlamaModel(path, lm_head_bf16=True)
    ids = torch.tensor(tok("The three primary colors are").input_ids)
    for model, on_grid in ((bf16, True), (fp32, False)):
        cache = KVCache(model.cfg, capacity=len(ids))
        hidden = model.forward(ids, [Segment(cache, 0, len(ids))])
        for rows in (hidden[-1:], hidden[-3:]):  # the one-row and the few-row head paths
            logits = model.logits(rows)
            assert logits.dtype == torch.float32
            assert torch.equal(logits, logits.to(torch.bfloat16).float()) == on_grid


# --- the planted step delay, incremental text, metrics snapshots ----------------------------
def test_busy_wait_waits_at_least_the_delay():
    from pairaudit.refserver.engine import busy_wait

    for seconds in (0.0, 50e-6, 2e-3):
        t = time.perf_counter()
        busy_wait(seconds)
        assert time.perf_counter() - t >= seconds


def test_step_delay_slows_every_decode_step_by_at_least_the_delay(real):
    from pairaudit.refserver.metrics import LATENCY_BUCKETS, Metrics

    _, tok, model = real
    ids = tok("The three primary colors are").input_ids
    outputs, hists = [], []
    for delay_us in (0, 100_000):
        metrics = Metrics("m")
        eng = Engine(model, tok, max_model_len=256, switches=Switches(step_delay_us=delay_us), metrics=metrics)
        req = eng.submit(Request(prompt=ids, params=SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)))
        while not req.done:
            eng.step_once()
        outputs.append(req.output)
        hists.append(metrics.hist["vllm:inter_token_latency_seconds"])
    assert outputs[0] == outputs[1]  # a delay changes when tokens come, never which
    at_100ms = LATENCY_BUCKETS.index(0.1)
    for h in hists:
        assert h[-2] == 5  # one prefill step (its first token) and four decode steps
    # every decode step took at least the delay: only the prefill step may be in a bucket below it
    assert hists[1][at_100ms] <= 1
    assert hists[1][-1] >= 4 * 0.1


def test_incremental_text_equals_the_whole_decode(real):
    from pairaudit.refserver.tokenizer import IncrementalText

    _, tok, _ = real
    texts = ["Hello, world! The café serves crème brûlée.", "emoji 😀🎉 and 日本語のテキスト mixed in",
             "  leading spaces\nnew lines\n\n\ttabs", "<|im_end|> special, then text"]
    for text in texts:
        ids = tok(text, add_special_tokens=False).input_ids
        inc = IncrementalText(tok)
        for n in range(1, len(ids) + 1):
            got = inc.extend(ids[:n])
            whole = tok.decode(ids[:n], skip_special_tokens=True)
            assert whole.startswith(got)  # all of it, less at most a half character at the end
        assert inc.text == tok.decode(ids, skip_special_tokens=True)
    # a byte split over tokens: nothing of the half character is shown until it is whole
    ids = list(range(200, 260))
    inc = IncrementalText(tok)
    for n in range(1, len(ids) + 1):
        assert "\ufffd" not in inc.extend(ids[:n])[-1:]


def test_metrics_state_round_trip_renders_the_same():
    from pairaudit.refserver.metrics import Metrics

    a = Metrics("m")
    a.inc("vllm:generation_tokens_total", 3)
    a.observe("vllm:inter_token_latency_seconds", 0.003)
    a.accepted_at(1)
    a.finish("stop")
    a.set_queue(2, 1)
    b = Metrics("m")
    b.load(a.state())
    assert b.render() == a.render()


def _batch_engine(**switches):
    from pairaudit.refserver.metrics import Metrics

    eng = Engine.__new__(Engine)
    eng.eos, eng.max_model_len, eng.metrics = 0, 1000, Metrics("m")
    eng.switches, eng.track, eng.touched = Switches(**switches), False, {}
    return eng


def _batch(eng, rows, params):
    reqs = [Request(prompt=[1], params=p, events=None) for p in params]
    eng._sample_batch([(r, rows[i : i + 1]) for i, r in enumerate(reqs)])
    return reqs


def test_batched_sampler_agrees_with_the_per_request_one():
    # the sampler a CUDA server runs, exercised here on CPU tensors: same choices, same logprob entries
    torch.manual_seed(0)
    rows = torch.randn(5, 64) * 3
    eng = _batch_engine()
    params = [SamplingParams(max_tokens=9, temperature=0.0, logprobs=3),
              SamplingParams(max_tokens=9, temperature=1.0, top_k=1, seed=1, logprobs=0),
              SamplingParams(max_tokens=9, temperature=0.8, min_p=1.0, seed=2),
              SamplingParams(max_tokens=9, temperature=0.0, min_tokens=2, stop_token_ids=(5,)),
              SamplingParams(max_tokens=9, temperature=1.0, top_p=0.5, top_k=10, seed=3, logprobs=5)]
    reqs = _batch(eng, rows, params)
    argmax = rows.argmax(-1).tolist()
    assert [r.output[0] for r in reqs[:3]] == argmax[:3]  # greedy, top_k=1 and min_p=1 are all the argmax
    banned = rows[3].clone()
    banned[[5, 0]] = float("-inf")
    assert reqs[3].output[0] == int(banned.argmax())
    for r, row in ((reqs[0], rows[0]), (reqs[1], rows[1]), (reqs[4], rows[4])):
        raw = torch.log_softmax(row, -1)
        e = r.emitted[0]
        assert e.token == r.output[0] and e.logprob == raw[e.token].item()
        assert e.rank == int((raw > raw[e.token]).sum()) + 1
        vals, ids = torch.topk(raw, r.params.logprobs or 0)
        assert e.top == list(zip(ids.tolist(), vals.tolist()))
    # top-p 0.5 within top-k 10: only tokens of the nucleus are ever drawn
    probs = torch.softmax(rows[4], -1)
    order = probs.argsort(descending=True)
    nucleus = set(order[: int((probs[order].cumsum(0) - probs[order] <= 0.5).sum())].tolist())
    seen = set()
    for seed in range(40):
        p = SamplingParams(max_tokens=9, temperature=1.0, top_p=0.5, top_k=10, seed=seed)
        seen.add(_batch(eng, rows[4:5], [p])[0].output[0])
    assert seen <= nucleus and len(seen) > 1


def test_batched_sampler_seeded_rows_repeat_whatever_the_batch():
    torch.manual_seed(1)
    rows = torch.randn(4, 64)
    eng = _batch_engine()
    p = SamplingParams(max_tokens=9, temperature=1.0, seed=7)
    alone = _batch(eng, rows[2:3], [p])[0].output
    batched = _batch(eng, rows, [SamplingParams(max_tokens=9, temperature=1.0)] * 2 + [p]
                     + [SamplingParams(max_tokens=9, temperature=0.0)])[2].output
    assert alone == batched


def test_batched_sampler_fault_tail_emits_the_runner_up():
    rows = torch.tensor([[0.0, 3.0, 2.0, 1.0]])
    eng = _batch_engine(fault_tail=10)
    eng.max_model_len = 5  # position 1 + 0 >= 5 - 10: in the tail
    assert _batch(eng, rows, [SamplingParams(max_tokens=1, temperature=0.0)])[0].output == [2]
