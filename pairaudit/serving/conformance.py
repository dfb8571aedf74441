"""The API contract the audit relies on, checked against a live server.

Every phase of an audit reads a server's answers through assumptions about
its API: where the context limit is refused and with which words, that
``max_tokens`` is silently lowered to what fits (and how that shows), which
``cache_salt`` values are accepted, the shape of a chat message, the top-20
logprobs the greedy diagnostics need, the usage block of a stream, the metric
names the speed phase scrapes.  vLLM releases differ on several of these
(docs/vllm.md has the table).  Each check here sends a fixed set of requests
and reduces the answers to an *outcome*: status codes, shapes and the
decisive words of an error, nothing that varies from run to run.

``KNOWN`` holds the outcomes of vLLM 0.32, the release the reference server
follows; ``run`` returns a server's outcomes, and ``differences`` what sets
them apart.  The same checks run in three places: against real vLLM's CPU
build and the reference server side by side (the ``vllm`` tests), against
any server on demand, and against responses recorded from a server no CI
machine can run (vLLM on a GPU, replayed by ``serving.recording``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import requests

from pairaudit.serving.armspec import resolve_spec
from pairaudit.serving.client import Endpoint, clamping
from pairaudit.serving.preflight import run_preflight

TIMEOUT_S = 300


@dataclasses.dataclass(frozen=True)
class Target:
    """One server under check: its base URL, served model name and context length."""

    url: str
    model: str
    max_model_len: int

    def post(self, path: str, body: dict) -> tuple[int, Any]:
        r = requests.post(self.url + path, json={"model": self.model, **body}, timeout=TIMEOUT_S)
        try:
            return r.status_code, r.json()
        except ValueError:
            return r.status_code, r.text

    def get(self, path: str) -> Any:
        r = requests.get(self.url + path, timeout=TIMEOUT_S)
        try:
            return r.json()
        except ValueError:
            return r.text


def err(body: Any) -> dict:
    e = body.get("error") if isinstance(body, dict) else None
    return e if isinstance(e, dict) else {}


def ids(n: int, tid: int = 1000) -> list[int]:
    """A prompt of exactly ``n`` tokens, as token ids (no tokenizer in between)."""
    return [tid] * n


# --- checks: target -> outcome ---------------------------------------------------

def c_models(t: Target) -> dict:
    card = t.get("/v1/models")["data"][0]
    return {"id": card["id"], "max_model_len": card["max_model_len"], "root_is_path": isinstance(card.get("root"), str)
            and len(card["root"]) > 1, "owned_by": card.get("owned_by")}


def c_version(t: Target) -> dict:
    return {"version_is_str": isinstance(t.get("/version").get("version"), str)}


def c_tokenize_roundtrip(t: Target) -> dict:
    text = "Paired audits: control and candidate. Naïve café, 42% ✓"
    s, tok = t.post("/tokenize", {"prompt": text, "add_special_tokens": False})
    s2, de = t.post("/detokenize", {"tokens": tok["tokens"]})
    return {"status": [s, s2], "count_matches": tok["count"] == len(tok["tokens"]),
            "max_model_len": tok["max_model_len"], "roundtrip": de["prompt"] == text}


def c_logprobs20(t: Target) -> dict:
    s, b = t.post("/v1/completions", {"prompt": "The three primary colors are", "max_tokens": 3, "temperature": 0,
                                      "logprobs": 20, "return_tokens_as_token_ids": True, "ignore_eos": True})
    lp = b["choices"][0]["logprobs"]
    return {"status": s, "positions": len(lp["top_logprobs"]),
            "at_least_20": all(len(x) >= 20 for x in lp["top_logprobs"]),
            "token_id_keys": all(k.startswith("token_id:") for x in lp["top_logprobs"] for k in x),
            "tokens": all(x.startswith("token_id:") for x in lp["tokens"]),
            "completion_tokens": b["usage"]["completion_tokens"]}


def c_logprobs21(t: Target) -> dict:
    s, b = t.post("/v1/completions", {"prompt": "Hi", "max_tokens": 1, "logprobs": 21})
    return {"status": s, "param": err(b).get("param"),
            "says": "Requested sample logprobs of 21, which is greater than max allowed: 20" in err(b).get("message", "")}


def c_prompt_over_context(t: Target) -> dict:
    mml = t.max_model_len
    s, b = t.post("/v1/completions", {"prompt": ids(mml + 1), "max_tokens": 1, "temperature": 0})
    return {"status": s, "param": err(b).get("param"),
            "says": err(b).get("message", "").startswith(f"This model's maximum context length is {mml} tokens. "
                                                          f"However, your prompt contains at least {mml + 1} input "
                                                          "tokens")}


def c_prompt_fills_context(t: Target) -> dict:
    s, b = t.post("/v1/completions", {"prompt": ids(t.max_model_len), "max_tokens": 4, "temperature": 0})
    return {"status": s, "says": err(b).get("message", "").startswith("max_tokens must be at least 1, got 0.")}


def c_silent_clamp(t: Target) -> dict:
    body = {"prompt": ids(t.max_model_len - 2), "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    s, b = t.post("/v1/completions", body)
    if s != 200:  # a release that refuses instead of lowering max_tokens
        return {"status": s, "says": err(b).get("message", "")[:80]}
    ch = b["choices"][0]
    c = clamping(body, ch["finish_reason"], b["usage"], t.max_model_len)
    return {"status": s, "completion_tokens": b["usage"]["completion_tokens"], "finish_reason": ch["finish_reason"],
            "clamped": c["clamped"], "over_context": c["over_context"]}


def c_exact_fit_is_not_clamped(t: Target) -> dict:
    body = {"prompt": ids(t.max_model_len - 4), "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    s, b = t.post("/v1/completions", body)
    ch = b["choices"][0]
    return {"status": s, "total": b["usage"]["total_tokens"],
            "clamped": clamping(body, ch["finish_reason"], b["usage"], t.max_model_len)["clamped"]}


SALTS = (("128", "s" * 128), ("129", "s" * 129), ("slash", "a/b"), ("at", "a@b"), ("backslash", "a\\b"),
         ("empty", ""), ("ours", "vllm-cpu-candidate-tail-16-0123abcd"))


def c_cache_salt(t: Target) -> dict:
    out = {}
    for name, salt in SALTS:
        s, b = t.post("/v1/completions", {"prompt": "Hi", "max_tokens": 1, "cache_salt": salt})
        out[name] = [s, err(b).get("param")]
    return out


def c_chat_message_shape(t: Target) -> dict:
    s, b = t.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4,
                                           "temperature": 0})
    msg = b["choices"][0]["message"]
    return {"status": s, "role": msg["role"], "content_is_str": isinstance(msg["content"], str),
            "reasoning_key": "reasoning" in msg, "reasoning": msg.get("reasoning")}


def c_seeded_chat_repeats(t: Target) -> dict:
    body = {"messages": [{"role": "user", "content": "Name a river."}], "max_tokens": 8, "temperature": 0.7,
            "top_p": 0.8, "top_k": 20, "seed": 20240}
    a = t.post("/v1/chat/completions", {**body, "cache_salt": "one"})
    b = t.post("/v1/chat/completions", {**body, "cache_salt": "two"})
    return {"status": [a[0], b[0]], "same": a[1]["choices"][0]["message"] == b[1]["choices"][0]["message"]}


def c_stream_usage(t: Target) -> dict:
    out = Endpoint(t.url, model=t.model, timeout_s=TIMEOUT_S).stream_completion(
        "/v1/completions", {"model": t.model, "prompt": "Count: one, two,", "max_tokens": 5, "temperature": 0,
                            "ignore_eos": True})
    return {"status": out["status"], "error": out["error"], "output_tokens": out["output_tokens"],
            "finish_reason": out["finish_reason"], "has_ttft": out["ttft_s"] is not None}


def c_prompt_logprobs_stream(t: Target) -> dict:
    s, b = t.post("/v1/completions", {"prompt": "Hi", "max_tokens": 1, "prompt_logprobs": 1, "stream": True})
    return {"status": s, "says": "`prompt_logprobs` are not available when `stream=True`." in err(b).get("message", "")}


def c_min_tokens_over_max(t: Target) -> dict:
    s, b = t.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "min_tokens": 3})
    return {"status": s, "says": "min_tokens must be less than or equal to max_tokens=2" in err(b).get("message", "")}


def c_unknown_model(t: Target) -> dict:
    r = requests.post(t.url + "/v1/completions", json={"model": "gpt-99", "prompt": "Hi", "max_tokens": 1},
                      timeout=TIMEOUT_S)
    return {"status": r.status_code, "names_it": "gpt-99" in err(r.json()).get("message", "")}


METRICS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket",
           "vllm:e2e_request_latency_seconds_count")


def c_metrics(t: Target) -> dict:
    text = t.get("/metrics")
    return {name: (name + " ") in text or (name + "{") in text for name in METRICS}


def c_preflight(t: Target) -> dict:
    spec = resolve_spec("control", {"mode": "attach", "url": t.url, "model": t.model,
                                    "max_model_len": t.max_model_len})
    res = run_preflight(Endpoint(t.url, model=t.model, timeout_s=TIMEOUT_S), spec)
    return {"verdict": res["verdict"], "failed_probe": res["failed_probe"],
            "reason": None if res["verdict"] == "PASS" else res["probes"][-1]["reason"]}


CHECKS: dict[str, Callable[[Target], dict]] = {
    "models": c_models, "version": c_version, "tokenize_roundtrip": c_tokenize_roundtrip,
    "logprobs20": c_logprobs20, "logprobs21": c_logprobs21, "prompt_over_context": c_prompt_over_context,
    "prompt_fills_context": c_prompt_fills_context, "silent_clamp": c_silent_clamp,
    "exact_fit_is_not_clamped": c_exact_fit_is_not_clamped, "cache_salt": c_cache_salt,
    "chat_message_shape": c_chat_message_shape, "seeded_chat_repeats": c_seeded_chat_repeats,
    "stream_usage": c_stream_usage, "prompt_logprobs_stream": c_prompt_logprobs_stream,
    "min_tokens_over_max": c_min_tokens_over_max, "unknown_model": c_unknown_model, "metrics": c_metrics,
    "preflight": c_preflight,
}


def known(model: str, max_model_len: int) -> dict[str, dict]:
    """vLLM 0.32's outcome of every check (what the reference server must also give)."""
    return {
        "models": {"id": model, "max_model_len": max_model_len, "root_is_path": True, "owned_by": "vllm"},
        "version": {"version_is_str": True},
        "tokenize_roundtrip": {"status": [200, 200], "count_matches": True, "max_model_len": max_model_len,
                               "roundtrip": True},
        "logprobs20": {"status": 200, "positions": 3, "at_least_20": True, "token_id_keys": True, "tokens": True,
                       "completion_tokens": 3},
        "logprobs21": {"status": 400, "param": "logprobs", "says": True},
        "prompt_over_context": {"status": 400, "param": "input_tokens", "says": True},
        "prompt_fills_context": {"status": 400, "says": True},
        "silent_clamp": {"status": 200, "completion_tokens": 2, "finish_reason": "length", "clamped": True,
                         "over_context": True},
        "exact_fit_is_not_clamped": {"status": 200, "total": max_model_len, "clamped": False},
        "cache_salt": {"128": [200, None], "129": [400, "cache_salt"], "slash": [400, "cache_salt"],
                       "at": [400, "cache_salt"], "backslash": [400, "cache_salt"], "empty": [400, "cache_salt"],
                       "ours": [200, None]},
        "chat_message_shape": {"status": 200, "role": "assistant", "content_is_str": True, "reasoning_key": True,
                               "reasoning": None},
        "seeded_chat_repeats": {"status": [200, 200], "same": True},
        "stream_usage": {"status": 200, "error": None, "output_tokens": 5, "finish_reason": "length",
                         "has_ttft": True},
        "prompt_logprobs_stream": {"status": 400, "says": True},
        "min_tokens_over_max": {"status": 400, "says": True},
        "unknown_model": {"status": 404, "names_it": True},
        "metrics": {name: True for name in METRICS},
        "preflight": {"verdict": "PASS", "failed_probe": None, "reason": None},
    }


def run(target: Target, names: list[str] | None = None) -> dict[str, dict]:
    """Every check's outcome; a check that broke on an unexpected answer gives ``{"raised": ...}``.

    A release whose answer has another shape must show up as a difference,
    not stop the checks after it.
    """
    out: dict[str, dict] = {}
    for name in names or list(CHECKS):
        try:
            out[name] = CHECKS[name](target)
        except Exception as exc:  # noqa: BLE001 - any breakage is this check's outcome
            out[name] = {"raised": f"{type(exc).__name__}: {exc}"[:300]}
    return out


def differences(outcomes: dict[str, dict], expected: dict[str, dict]) -> dict[str, dict]:
    """The checks whose outcome is not the expected one: ``{name: {"expected": ..., "got": ...}}``."""
    return {name: {"expected": expected.get(name), "got": got} for name, got in outcomes.items()
            if got != expected.get(name)}


def dumps(outcomes: dict[str, dict]) -> str:
    return json.dumps(outcomes, indent=1, sort_keys=True)
