"""Differential conformance: the same API contract checks against real vLLM 0.32 and the reference server.

Each check sends the same requests to both servers and reduces the answers to
an *outcome* (status codes, shapes, the decisive words of an error); the two
outcomes must be equal, and equal to the known answer written beside the
check, so a check that returned nothing useful on both sides still fails.
The reference server follows vLLM 0.32 where releases differ (the context
limit and silent max_tokens clamping, the 128-character cache_salt, chat's
``message.reasoning``); these checks are how that claim is kept true.
"""

from __future__ import annotations

import json

import pytest
import requests
from vllm_fixture import MML, MODEL

from pairaudit.serving.client import Endpoint, clamping
from pairaudit.serving.armspec import resolve_spec
from pairaudit.serving.preflight import run_preflight

pytestmark = [pytest.mark.vllm, pytest.mark.server]


@pytest.fixture(scope="module")
def servers(vllm_pair, shared_server):
    return {"reference": shared_server(None, MML).url, "vllm": vllm_pair["fp32"].url}


def post(url, path, body):
    r = requests.post(url + path, json={"model": MODEL, **body}, timeout=300)
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, r.text


def err(body) -> dict:
    e = body.get("error") if isinstance(body, dict) else None
    return e if isinstance(e, dict) else {}


def ids(n, tid=1000):
    return [tid] * n


# --- checks: url -> outcome ------------------------------------------------------

def c_models(url):
    card = requests.get(url + "/v1/models", timeout=30).json()["data"][0]
    return {"id": card["id"], "max_model_len": card["max_model_len"], "root_is_path": isinstance(card.get("root"), str)
            and len(card["root"]) > 1, "owned_by": card.get("owned_by")}


def c_version(url):
    v = requests.get(url + "/version", timeout=30).json()
    return {"version_is_str": isinstance(v.get("version"), str)}


def c_tokenize_roundtrip(url):
    text = "Paired audits: control and candidate. Naïve café, 42% ✓"
    s, tok = post(url, "/tokenize", {"prompt": text, "add_special_tokens": False})
    s2, de = post(url, "/detokenize", {"tokens": tok["tokens"]})
    return {"status": [s, s2], "count_matches": tok["count"] == len(tok["tokens"]), "max_model_len": tok["max_model_len"],
            "roundtrip": de["prompt"] == text}


def c_logprobs20(url):
    s, b = post(url, "/v1/completions", {"prompt": "The three primary colors are", "max_tokens": 3, "temperature": 0,
                                         "logprobs": 20, "return_tokens_as_token_ids": True, "ignore_eos": True})
    lp = b["choices"][0]["logprobs"]
    return {"status": s, "positions": len(lp["top_logprobs"]),
            "at_least_20": all(len(t) >= 20 for t in lp["top_logprobs"]),
            "token_id_keys": all(k.startswith("token_id:") for t in lp["top_logprobs"] for k in t),
            "tokens": all(t.startswith("token_id:") for t in lp["tokens"]),
            "completion_tokens": b["usage"]["completion_tokens"]}


def c_logprobs21(url):
    s, b = post(url, "/v1/completions", {"prompt": "Hi", "max_tokens": 1, "logprobs": 21})
    return {"status": s, "param": err(b).get("param"),
            "says": "Requested sample logprobs of 21, which is greater than max allowed: 20" in err(b).get("message", "")}


def c_prompt_over_context(url):
    s, b = post(url, "/v1/completions", {"prompt": ids(MML + 1), "max_tokens": 1, "temperature": 0})
    msg = err(b).get("message", "")
    return {"status": s, "param": err(b).get("param"),
            "says": msg.startswith(f"This model's maximum context length is {MML} tokens. However, your prompt "
                                   f"contains at least {MML + 1} input tokens")}


def c_prompt_fills_context(url):
    s, b = post(url, "/v1/completions", {"prompt": ids(MML), "max_tokens": 4, "temperature": 0})
    return {"status": s, "says": err(b).get("message", "").startswith("max_tokens must be at least 1, got 0.")}


def c_silent_clamp(url):
    body = {"prompt": ids(MML - 2), "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    s, b = post(url, "/v1/completions", body)
    ch = b["choices"][0]
    c = clamping(body, ch["finish_reason"], b["usage"], MML)
    return {"status": s, "completion_tokens": b["usage"]["completion_tokens"], "finish_reason": ch["finish_reason"],
            "clamped": c["clamped"], "over_context": c["over_context"]}


def c_exact_fit_is_not_clamped(url):
    body = {"prompt": ids(MML - 4), "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    s, b = post(url, "/v1/completions", body)
    ch = b["choices"][0]
    return {"status": s, "total": b["usage"]["total_tokens"],
            "clamped": clamping(body, ch["finish_reason"], b["usage"], MML)["clamped"]}


def c_cache_salt(url):
    out = {}
    for name, salt in (("128", "s" * 128), ("129", "s" * 129), ("slash", "a/b"), ("at", "a@b"),
                       ("backslash", "a\\b"), ("empty", ""), ("ours", "vllm-cpu-candidate-tail-16-0123abcd")):
        s, b = post(url, "/v1/completions", {"prompt": "Hi", "max_tokens": 1, "cache_salt": salt})
        out[name] = [s, err(b).get("param")]
    return out


def c_chat_message_shape(url):
    s, b = post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4,
                                              "temperature": 0})
    msg = b["choices"][0]["message"]
    return {"status": s, "role": msg["role"], "content_is_str": isinstance(msg["content"], str),
            "reasoning_key": "reasoning" in msg, "reasoning": msg.get("reasoning")}


def c_seeded_chat_repeats(url):
    body = {"messages": [{"role": "user", "content": "Name a river."}], "max_tokens": 8, "temperature": 0.7,
            "top_p": 0.8, "top_k": 20, "seed": 20240}
    a = post(url, "/v1/chat/completions", {**body, "cache_salt": "one"})
    b = post(url, "/v1/chat/completions", {**body, "cache_salt": "two"})
    return {"status": [a[0], b[0]], "same": a[1]["choices"][0]["message"] == b[1]["choices"][0]["message"]}


def c_stream_usage(url):
    out = Endpoint(url, model=MODEL, timeout_s=300).stream_completion(
        "/v1/completions", {"model": MODEL, "prompt": "Count: one, two,", "max_tokens": 5, "temperature": 0,
                            "ignore_eos": True})
    return {"status": out["status"], "error": out["error"], "output_tokens": out["output_tokens"],
            "finish_reason": out["finish_reason"], "has_ttft": out["ttft_s"] is not None}


def c_prompt_logprobs_stream(url):
    s, b = post(url, "/v1/completions", {"prompt": "Hi", "max_tokens": 1, "prompt_logprobs": 1, "stream": True})
    return {"status": s, "says": "`prompt_logprobs` are not available when `stream=True`." in err(b).get("message", "")}


def c_min_tokens_over_max(url):
    s, b = post(url, "/v1/completions", {"prompt": "Hi", "max_tokens": 2, "min_tokens": 3})
    return {"status": s, "says": "min_tokens must be less than or equal to max_tokens=2" in err(b).get("message", "")}


def c_unknown_model(url):
    r = requests.post(url + "/v1/completions", json={"model": "gpt-99", "prompt": "Hi", "max_tokens": 1}, timeout=60)
    return {"status": r.status_code, "names_it": "gpt-99" in err(r.json()).get("message", "")}


def c_metrics(url):
    text = requests.get(url + "/metrics", timeout=30).text
    return {name: (name + " ") in text or (name + "{") in text
            for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                         "vllm:time_to_first_token_seconds_bucket", "vllm:e2e_request_latency_seconds_count")}


def c_preflight(url):
    spec = resolve_spec("control", {"mode": "attach", "url": url, "model": MODEL, "max_model_len": MML})
    res = run_preflight(Endpoint(url, model=MODEL, timeout_s=300), spec)
    return {"verdict": res["verdict"], "failed_probe": res["failed_probe"],
            "reason": None if res["verdict"] == "PASS" else res["probes"][-1]["reason"]}


CHECKS = {
    "models": (c_models, {"id": MODEL, "max_model_len": MML, "root_is_path": True, "owned_by": "vllm"}),
    "version": (c_version, {"version_is_str": True}),
    "tokenize_roundtrip": (c_tokenize_roundtrip, {"status": [200, 200], "count_matches": True, "max_model_len": MML,
                                                  "roundtrip": True}),
    "logprobs20": (c_logprobs20, {"status": 200, "positions": 3, "at_least_20": True, "token_id_keys": True,
                                  "tokens": True, "completion_tokens": 3}),
    "logprobs21": (c_logprobs21, {"status": 400, "param": "logprobs", "says": True}),
    "prompt_over_context": (c_prompt_over_context, {"status": 400, "param": "input_tokens", "says": True}),
    "prompt_fills_context": (c_prompt_fills_context, {"status": 400, "says": True}),
    "silent_clamp": (c_silent_clamp, {"status": 200, "completion_tokens": 2, "finish_reason": "length",
                                      "clamped": True, "over_context": True}),
    "exact_fit_is_not_clamped": (c_exact_fit_is_not_clamped, {"status": 200, "total": MML, "clamped": False}),
    "cache_salt": (c_cache_salt, {"128": [200, None], "129": [400, "cache_salt"], "slash": [400, "cache_salt"],
                                  "at": [400, "cache_salt"], "backslash": [400, "cache_salt"],
                                  "empty": [400, "cache_salt"], "ours": [200, None]}),
    "chat_message_shape": (c_chat_message_shape, {"status": 200, "role": "assistant", "content_is_str": True,
                                                  "reasoning_key": True, "reasoning": None}),
    "seeded_chat_repeats": (c_seeded_chat_repeats, {"status": [200, 200], "same": True}),
    "stream_usage": (c_stream_usage, {"status": 200, "error": None, "output_tokens": 5, "finish_reason": "length",
                                      "has_ttft": True}),
    "prompt_logprobs_stream": (c_prompt_logprobs_stream, {"status": 400, "says": True}),
    "min_tokens_over_max": (c_min_tokens_over_max, {"status": 400, "says": True}),
    "unknown_model": (c_unknown_model, {"status": 404, "names_it": True}),
    "metrics": (c_metrics, {"vllm:prompt_tokens_total": True, "vllm:generation_tokens_total": True,
                            "vllm:time_to_first_token_seconds_bucket": True,
                            "vllm:e2e_request_latency_seconds_count": True}),
    "preflight": (c_preflight, {"verdict": "PASS", "failed_probe": None, "reason": None}),
}


@pytest.mark.parametrize("name", list(CHECKS))
def test_same_outcome_on_real_vllm_and_the_reference_server(servers, name):
    check, expected = CHECKS[name]
    outcomes = {server: check(url) for server, url in servers.items()}
    assert outcomes["vllm"] == outcomes["reference"], json.dumps(outcomes, indent=1)
    assert outcomes["vllm"] == expected, json.dumps(outcomes, indent=1)
