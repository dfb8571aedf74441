"""The reference server, for real: the embedded model over HTTP on a loopback port."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading

import pytest
import requests
import torch
from refserver_fixture import REPO, module_server

pytestmark = pytest.mark.server
MODEL = "SmolLM2-135M-Instruct"
PROMPT = "The three primary colors are"
REPETITIVE = "Repeat after me five times: the cat sat on the mat. the cat sat on the mat. the cat sat on the mat."


server = module_server()
bf16_server = module_server({"PAIRAUDIT_REF_LM_HEAD_BF16": "1"})
spec_server = module_server({"PAIRAUDIT_REF_SPEC_NGRAM": "4"})


def greedy(server, prompt, n=16, **extra):
    return server.completion(prompt=prompt, max_tokens=n, temperature=0, **extra)


# --- endpoints -------------------------------------------------------------
def test_health_models_version(server):
    assert server.get("/health").status_code == 200
    card = server.get("/v1/models").json()["data"][0]
    assert card["id"] == MODEL and card["max_model_len"] == 512 and card["object"] == "model"
    info = server.get("/version").json()
    assert info["pairaudit"]["switches"]["PAIRAUDIT_REF_LM_HEAD_BF16"] == "0"
    assert len(info["pairaudit"]["model"]["weights_sha256"]) == 64


def test_tokenize_detokenize_roundtrip(server):
    tok = server.post("/tokenize", {"model": MODEL, "prompt": PROMPT, "return_token_strs": True}).json()
    assert tok["count"] == len(tok["tokens"]) > 3 and tok["max_model_len"] == 512
    assert len(tok["token_strs"]) == tok["count"]
    back = server.post("/detokenize", {"model": MODEL, "tokens": tok["tokens"]}).json()
    assert back["prompt"] == PROMPT
    chat = server.post("/tokenize", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).json()
    text = server.post("/detokenize", {"model": MODEL, "tokens": chat["tokens"]}).json()["prompt"]
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")


def test_completion_shape_usage_and_length_finish(server):
    out = greedy(server, PROMPT, n=8)
    assert out["object"] == "text_completion" and out["id"].startswith("cmpl-")
    choice = out["choices"][0]
    assert choice["finish_reason"] == "length" and choice["stop_reason"] is None
    assert out["usage"]["completion_tokens"] == 8
    assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + 8
    assert isinstance(choice["text"], str) and choice["text"]


def test_token_id_prompt_equals_text_prompt(server):
    ids = server.post("/tokenize", {"model": MODEL, "prompt": PROMPT}).json()["tokens"]
    a = greedy(server, PROMPT)["choices"][0]["text"]
    b = greedy(server, ids)["choices"][0]["text"]
    assert a == b


def test_logprobs_20_with_token_ids(server):
    out = greedy(server, PROMPT, n=4, logprobs=20, return_tokens_as_token_ids=True)
    lp = out["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 4
    for token, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert token.startswith("token_id:")
        assert len(top) >= 20 and all(k.startswith("token_id:") for k in top)
        # greedy: the emitted token is the top-1 of the raw distribution
        assert value == max(top.values()) and top[token] == value
        assert sum(math.exp(v) for v in top.values()) <= 1.0 + 1e-5
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])


def test_prompt_logprobs(server):
    out = server.completion(prompt=PROMPT, max_tokens=1, temperature=0, prompt_logprobs=3)
    pl = out["choices"][0]["prompt_logprobs"]
    ids = server.post("/tokenize", {"model": MODEL, "prompt": PROMPT}).json()["tokens"]
    assert pl[0] is None and len(pl) == len(ids)
    for pos in range(1, len(ids)):
        entry = pl[pos]
        assert str(ids[pos]) in entry  # the actual prompt token is always present
        ranks = sorted(v["rank"] for v in entry.values())
        assert ranks[:3] == [1, 2, 3]
        assert all(v["logprob"] <= 0 for v in entry.values())


def test_seeded_sampling_repeatable_and_seed_matters(server):
    body = dict(prompt=PROMPT, max_tokens=24, temperature=1.0, top_p=0.95, top_k=50, seed=1234)
    a = server.completion(**body)["choices"][0]["text"]
    b = server.completion(**body)["choices"][0]["text"]
    c = server.completion(**{**body, "seed": 99})["choices"][0]["text"]
    d = server.completion(**{**body, "seed": 7})["choices"][0]["text"]
    assert a == b
    assert len({a, c, d}) > 1


def test_top_k_1_is_greedy_and_min_p_1_is_greedy(server):
    g = greedy(server, PROMPT)["choices"][0]["text"]
    assert server.completion(prompt=PROMPT, max_tokens=16, temperature=1.0, top_k=1, seed=5)["choices"][0]["text"] == g
    assert server.completion(prompt=PROMPT, max_tokens=16, temperature=1.0, min_p=1.0, seed=5)["choices"][0]["text"] == g


def test_stop_string_and_stop_token_ids(server):
    full = greedy(server, PROMPT, n=24)["choices"][0]["text"]
    word = full.split()[2]
    out = greedy(server, PROMPT, n=24, stop=[word])["choices"][0]
    assert out["finish_reason"] == "stop" and out["stop_reason"] == word
    assert out["text"] == full[: full.find(word)]
    ids = greedy(server, PROMPT, n=24, logprobs=0, return_tokens_as_token_ids=True)["choices"][0]["logprobs"]["tokens"]
    third = int(ids[2].split(":")[1])
    out = greedy(server, PROMPT, n=24, stop_token_ids=[third])
    assert out["choices"][0]["finish_reason"] == "stop" and out["choices"][0]["stop_reason"] == third
    assert out["usage"]["completion_tokens"] == 3


def test_natural_eos_ignore_eos_and_min_tokens(server):
    msgs = [{"role": "user", "content": "Say just the word yes."}]
    natural = server.post("/v1/chat/completions", {"model": MODEL, "messages": msgs, "temperature": 0,
                                                   "max_tokens": 64}).json()
    assert natural["choices"][0]["finish_reason"] == "stop"
    n = natural["usage"]["completion_tokens"]
    forced = server.post("/v1/chat/completions", {"model": MODEL, "messages": msgs, "temperature": 0,
                                                  "max_tokens": n + 5, "ignore_eos": True}).json()
    assert forced["choices"][0]["finish_reason"] == "length" and forced["usage"]["completion_tokens"] == n + 5
    at_least = server.post("/v1/chat/completions", {"model": MODEL, "messages": msgs, "temperature": 0,
                                                    "max_tokens": 64, "min_tokens": n + 3}).json()
    assert at_least["usage"]["completion_tokens"] >= n + 3


def test_chat_completion_shape_logprobs_and_template_kwargs(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Name a color."}], "temperature": 0,
            "max_completion_tokens": 6, "logprobs": True, "top_logprobs": 5, "seed": 3}
    out = server.post("/v1/chat/completions", body).json()
    assert out["object"] == "chat.completion"
    msg = out["choices"][0]["message"]
    assert msg["role"] == "assistant" and msg["content"]
    content = out["choices"][0]["logprobs"]["content"]
    assert len(content) == out["usage"]["completion_tokens"] <= 6
    assert all(len(c["top_logprobs"]) == 5 and isinstance(c["bytes"], list) for c in content)
    # add_generation_prompt=False through chat_template_kwargs changes the prompt
    off = server.post("/v1/chat/completions", {**body, "chat_template_kwargs": {"add_generation_prompt": False}})
    assert off.status_code == 200 and off.json()["usage"]["prompt_tokens"] < out["usage"]["prompt_tokens"]


def test_cache_salt_accepted_and_does_not_change_output(server):
    a = greedy(server, PROMPT, cache_salt="salt-a")["choices"][0]["text"]
    b = greedy(server, PROMPT, cache_salt="salt-b")["choices"][0]["text"]
    assert a == b
    r = server.post("/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 2, "cache_salt": ""})
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"
    # vLLM 0.32's limits: at most 128 characters, none of @ / \\ NUL
    ok = server.post("/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 1, "cache_salt": "s" * 128})
    assert ok.status_code == 200
    for bad in ("s" * 129, "a/b", "a@b", "a\\b", "a\x00b"):
        r = server.post("/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 1, "cache_salt": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt", bad
        assert "at most 128 characters" in r.json()["error"]["message"]


def _sse(resp):
    events = []
    for line in resp.iter_lines(decode_unicode=True):
        if line.startswith("data: "):
            events.append(line[6:])
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_streaming_completion_with_usage(server):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    with server.post("/v1/completions", body, stream=True) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        chunks = _sse(r)
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == greedy(server, PROMPT, n=12)["choices"][0]["text"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12
    finals = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finals[-1] == "length" and all(f is None for f in finals[:-1])


def _raw_chunks(url: str, path: str, body: dict) -> tuple[str, list[bytes]]:
    """POST over a bare socket and split the chunked body into its HTTP chunks, as they were framed."""
    import socket
    from urllib.parse import urlsplit
    u = urlsplit(url)
    payload = json.dumps(body).encode()
    with socket.create_connection((u.hostname, u.port), timeout=120) as sock:
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(payload), payload))
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    head, _, rest = raw.partition(b"\r\n\r\n")
    chunks = []
    while rest:
        size, _, rest = rest.partition(b"\r\n")
        n = int(size, 16)
        chunks.append(rest[:n])
        assert rest[n:n + 2] == b"\r\n", "chunk not terminated by CRLF"
        rest = rest[n + 2:]
        if n == 0:
            break
    return head.decode(), chunks


def test_stream_frames_every_event_as_its_own_http_chunk(server):
    # One event per chunk is what lets a client time each event on arrival
    # (TTFT, ITL per chunk); unframed, a buffered reader gets several at once.
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    head, chunks = _raw_chunks(server.url, "/v1/completions", body)
    assert "Transfer-Encoding: chunked" in head
    assert chunks[-1] == b"" and chunks[-2] == b"data: [DONE]\n\n"
    events = chunks[:-2]
    assert all(c.startswith(b"data: {") and c.endswith(b"\n\n") and c.count(b"data: ") == 1 for c in events)
    assert sum(1 for c in events if json.loads(c[6:])["choices"]) == 6  # greedy, 6 tokens, one chunk each


def test_streaming_chat(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 10,
            "temperature": 0, "stream": True}
    with server.post("/v1/chat/completions", body, stream=True) as r:
        chunks = _sse(r)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    plain = server.post("/v1/chat/completions", {**body, "stream": False}).json()
    assert text == plain["choices"][0]["message"]["content"]


def test_metrics_prometheus_names_move(server):
    before = {n: server.metric(n) for n in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                                            "vllm:time_to_first_token_seconds_count",
                                            "vllm:e2e_request_latency_seconds_count")}
    out = greedy(server, PROMPT, n=5)
    after = {n: server.metric(n) for n in before}
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 5
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == out["usage"]["prompt_tokens"]
    assert after["vllm:time_to_first_token_seconds_count"] == before["vllm:time_to_first_token_seconds_count"] + 1
    text = server.get("/metrics").text
    for name in ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_total", "vllm:inter_token_latency_seconds_bucket"):
        assert name in text


# --- errors ----------------------------------------------------------------
@pytest.mark.parametrize(
    "body, param, needle",
    [
        ({"prompt": PROMPT, "max_tokens": 4, "logprobs": 21}, "logprobs", "max allowed: 20"),
        ({"prompt": PROMPT, "max_tokens": "four"}, "max_tokens", "expected an integer"),
        ({"prompt": PROMPT, "max_tokens": 4, "temperature": "hot"}, "temperature", "expected a number"),
        ({"prompt": PROMPT, "max_tokens": 4, "ignore_eos": 1}, "ignore_eos", "expected a boolean"),
        ({"prompt": PROMPT, "max_tokens": 4, "prompt_logprobs": 1, "stream": True}, "prompt_logprobs", "stream"),
        ({"prompt": [1, 2, 10**9], "max_tokens": 4}, "prompt", "out of vocabulary"),
    ],
)
def test_bad_requests_are_400_with_vllm_error_body(server, body, param, needle):
    r = server.post("/v1/completions", {"model": MODEL, **body})
    assert r.status_code == 400
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == 400
    assert err["param"] == param and needle in err["message"]


def test_context_limit_boundary(server):
    limit = server.max_model_len
    ok = server.post("/v1/completions", {"model": MODEL, "prompt": [42] * (limit - 4), "max_tokens": 4,
                                         "temperature": 0, "ignore_eos": True})
    assert ok.status_code == 200 and ok.json()["usage"]["total_tokens"] == limit
    # vLLM 0.32: a prompt that fits is served with max_tokens silently lowered to what fits
    clamped = server.post("/v1/completions", {"model": MODEL, "prompt": [42] * (limit - 3), "max_tokens": 4,
                                              "temperature": 0, "ignore_eos": True})
    assert clamped.status_code == 200, clamped.text
    assert clamped.json()["usage"]["completion_tokens"] == 3 and clamped.json()["choices"][0]["finish_reason"] == "length"
    # a prompt of exactly max_model_len leaves no room: vLLM's max_tokens refusal
    full = server.post("/v1/completions", {"model": MODEL, "prompt": [42] * limit, "max_tokens": 4})
    assert full.status_code == 400 and full.json()["error"]["message"].startswith("max_tokens must be at least 1, got 0.")
    over = server.post("/v1/completions", {"model": MODEL, "prompt": [42] * (limit + 1), "max_tokens": 1})
    assert over.status_code == 400
    err = over.json()["error"]
    assert err["param"] == "input_tokens"
    assert err["message"].startswith(f"This model's maximum context length is {limit} tokens. However, your prompt "
                                     f"contains at least {limit + 1} input tokens")


def test_malformed_json_and_unknown_model(server):
    r = requests.post(server.url + "/v1/completions", data=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"]["message"]
    r = server.post("/v1/completions", {"model": "gpt-99", "prompt": PROMPT, "max_tokens": 2})
    assert r.status_code == 404 and "gpt-99" in r.json()["error"]["message"]
    r = server.post("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                                             "logprobs": 3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"


# --- batching --------------------------------------------------------------
def test_concurrent_requests_batch_and_match_solo_up_to_numerics(server):
    prompts = ["One, two, three,", "The sky is", "def add(a, b):", "Water boils at"]
    solo = [greedy(server, p, n=20, logprobs=2, return_tokens_as_token_ids=True)["choices"][0] for p in prompts]
    steps_before = server.metric("pairaudit:engine_steps_total")
    results = [None] * 4

    def run(i):
        results[i] = greedy(server, prompts[i], n=20, logprobs=2, return_tokens_as_token_ids=True)["choices"][0]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    steps = server.metric("pairaudit:engine_steps_total") - steps_before
    assert steps < 4 * 21  # forwards were shared (alone: 21 steps per request)
    for a, b in zip(solo, results):
        ta, tb = a["logprobs"]["tokens"], b["logprobs"]["tokens"]
        for pos, (x, y) in enumerate(zip(ta, tb)):
            if x != y:  # a batch-shape rounding flip is only possible at a near tie
                top = sorted(a["logprobs"]["top_logprobs"][pos].values(), reverse=True)
                assert top[0] - top[1] < 1e-3, (pos, x, y, top)
                break
            assert abs(a["logprobs"]["token_logprobs"][pos] - b["logprobs"]["token_logprobs"][pos]) < 1e-3


def test_openai_client(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    models = client.models.list()
    assert models.data[0].id == MODEL
    c = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=5,
                                  extra_body={"return_tokens_as_token_ids": True})
    assert c.choices[0].logprobs.tokens[0].startswith("token_id:")
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                          temperature=0, seed=1, logprobs=True, top_logprobs=3)
    assert chat.choices[0].message.content and len(chat.choices[0].logprobs.content[0].top_logprobs) == 3
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                            temperature=0, stream=True, stream_options={"include_usage": True})
    parts = list(stream)
    assert parts[-1].usage.completion_tokens == chat.usage.completion_tokens
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, logprobs=21)
    assert "max allowed: 20" in str(exc.value)


# --- switches --------------------------------------------------------------
def _top20(server, prompt, n):
    out = greedy(server, prompt, n=n, logprobs=20, return_tokens_as_token_ids=True)["choices"][0]["logprobs"]
    return out["top_logprobs"]


def _on_bf16_grid(values: list[float]) -> bool:
    """The smallest positive pairwise gap is a power of two and every pairwise gap is a multiple of it."""
    gaps = [abs(a - b) for i, a in enumerate(values) for b in values[i + 1 :]]
    step = min((g for g in gaps if g > 1e-6), default=None)
    if step is None:
        return False
    k = math.log2(step)
    if abs(k - round(k)) > 1e-4:
        return False
    tol = 8 * 2**-24 * max(abs(v) for v in values) + 1e-6
    return all(abs(g / step - round(g / step)) * step <= tol for g in gaps)


def test_bf16_grid_matches_torch_bf16_rounding():
    # the grid check itself, on synthetic logits: rounded to bf16 -> on grid; raw fp32 -> off grid
    torch.manual_seed(0)
    logits = torch.randn(1000) * 4 + 20
    on = torch.log_softmax(logits.to(torch.bfloat16).float(), -1).topk(20).values.tolist()
    off = torch.log_softmax(logits, -1).topk(20).values.tolist()
    assert _on_bf16_grid(on) and not _on_bf16_grid(off)


def test_spec_ngram_counters_greedy_equivalence_and_acceptance(server, spec_server):
    assert spec_server.get("/version").json()["pairaudit"]["speculative"]["num_speculative_tokens"] == 4
    names = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
             "vllm:spec_decode_num_accepted_tokens_total", "pairaudit:engine_steps_total")
    before = {n: spec_server.metric(n) for n in names}
    spec = greedy(spec_server, REPETITIVE, n=40, logprobs=1, return_tokens_as_token_ids=True)["choices"][0]
    delta = {n: spec_server.metric(n) - before[n] for n in names}
    plain = greedy(server, REPETITIVE, n=40, logprobs=1, return_tokens_as_token_ids=True)["choices"][0]
    assert delta["vllm:spec_decode_num_drafts_total"] > 0
    assert 0 < delta["vllm:spec_decode_num_accepted_tokens_total"] <= delta["vllm:spec_decode_num_draft_tokens_total"]
    # accepted drafts mean fewer forwards than tokens
    assert delta["pairaudit:engine_steps_total"] < 40
    # greedy output equals non-speculative greedy up to numerics (a flip only at a near tie)
    ta, tb = plain["logprobs"]["tokens"], spec["logprobs"]["tokens"]
    for pos, (x, y) in enumerate(zip(ta, tb)):
        if x != y:
            top = sorted(plain["logprobs"]["top_logprobs"][pos].values(), reverse=True)
            assert top[0] - top[1] < 1e-3
            break
    else:
        assert ta == tb


def test_spec_ngram_sampling_keeps_the_target_distribution(spec_server, server):
    # first-token distribution after a repetitive prompt: same seeds, compare empirical frequencies
    counts = {}
    for s, srv in (("spec", spec_server), ("plain", server)):
        toks = []
        for seed in range(40):
            out = srv.completion(prompt=REPETITIVE, max_tokens=3, temperature=1.0, seed=seed, logprobs=0,
                                 return_tokens_as_token_ids=True)
            toks.append(tuple(out["choices"][0]["logprobs"]["tokens"]))
        counts[s] = toks
    top_plain = max(set(counts["plain"]), key=counts["plain"].count)
    freq_spec = counts["spec"].count(top_plain) / 40
    freq_plain = counts["plain"].count(top_plain) / 40
    assert abs(freq_spec - freq_plain) < 0.35


def test_fault_tail_corrupts_only_near_the_context_end(server, shared_server):
    faulty = shared_server({"PAIRAUDIT_REF_FAULT_TAIL": "16"}, 512)
    far = greedy(faulty, PROMPT, n=16)["choices"][0]["text"]
    assert far == greedy(server, PROMPT, n=16)["choices"][0]["text"]
    ids = server.post("/tokenize", {"model": MODEL, "prompt": PROMPT * 150}).json()["tokens"][: 512 - 16]
    assert len(ids) == 512 - 16
    body = dict(prompt=ids, max_tokens=16, temperature=0)
    good = server.completion(**body)["choices"][0]["text"]
    bad = faulty.completion(**body)["choices"][0]["text"]
    assert bad != good


def test_fault_noise_breaks_greedy_repeatability_only(shared_server):
    noisy = shared_server({"PAIRAUDIT_REF_FAULT_NOISE": "2.0"}, 512)
    texts = {greedy(noisy, PROMPT, n=16)["choices"][0]["text"] for _ in range(3)}
    assert len(texts) > 1
    # a seeded sampled request is untouched, so it still repeats exactly
    body = dict(prompt=PROMPT, max_tokens=16, temperature=0.7, top_p=0.8, top_k=20, seed=1234)
    assert len({noisy.completion(**body)["choices"][0]["text"] for _ in range(2)}) == 1


def test_unloadable_model_exits_nonzero_with_reason(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pairaudit.refserver", "--model", str(tmp_path / "nope"),
                           "--port", "0"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "cannot start" in proc.stderr and "nope" in proc.stderr


def test_bad_switch_value_exits_nonzero_with_reason():
    import os

    env = {**os.environ, "PAIRAUDIT_REF_SPEC_NGRAM": "four"}
    proc = subprocess.run([sys.executable, "-m", "pairaudit.refserver", "--port", "0"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "PAIRAUDIT_REF_SPEC_NGRAM" in proc.stderr
