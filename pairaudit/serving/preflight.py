"""Preflight: the API rehearsal before any expensive work.

Tiny probes, in a fixed order, each kept with the server's own answer; the
first failing probe stops the run, because every later probe (and every later
stage) assumes the earlier ones held. A 4xx means the probe or the server's
API is not what the audit expects; a transport error or 5xx means no answer.

Result record (``run_preflight``)::

    {"schema": "pairaudit.preflight/v1", "arm": str, "url": str, "model": str,
     "speculative": bool, "max_model_len": int | None,   # as discovered
     "verdict": "PASS" | "FAIL", "failed_probe": str | None,
     "server_alive_after": bool | None,   # after a 5xx / no answer: did /health still answer
                                          # (a dead server is named in the failing probe's reason)
     "started_at": str, "finished_at": str, "probes": [Probe, ...]}

Probe::

    {"name": str, "pass": bool, "reason": str,
     "status": int | None, "body": <decisive response body, error bodies kept>,
     "error": str | None,                     # HttpResult.error of that response
     "calls": [Call, ...], "facts": {...}}    # facts: what the probe learned; after a 5xx or
                                              # no answer, facts.after_failure = health_after()

Call::

    {"method", "path", "request": <body or a summary for huge bodies> | None,
     "request_sha256": str | None, "status", "body", "error", "elapsed_s", "started_at"}

Probe order: health, api_key_required (only for an arm with an API key: the
same ``/v1/models`` request without the key must be refused, 401 or 403, so
nothing else on the host can use the server), models, tokenize_roundtrip, completion_logprobs20,
prompt_logprobs, seeded_repeat, max_model_len, known_bad_400, then
spec_counters_move (``speculative: true``) or spec_counters_still
(``speculative: false``: a control arm must not be drafting).
"""

from __future__ import annotations

import math
import re
import time
import uuid
from typing import Any, Callable

from pairaudit.core.artifacts import canonical_json, sha256_json, utc_now
from pairaudit.core.contracts import PREFLIGHT_SCHEMA
from pairaudit.serving.armspec import ArmSpec
from pairaudit.serving.client import Endpoint, chat_message, error_message, metrics

ROUNDTRIP_TEXT = "Paired audits compare two arms: control and candidate. Naïve café, 42% ✓"
COMPLETION_PROMPT = "The three primary colors are"
SEEDED_MESSAGES = [{"role": "user", "content": "Name a river and say one thing about it."}]
# n-gram speculation drafts from repeats already in the context, so the prompt
# itself must be repetitive for the counters to have something to move on.
REPETITIVE_MESSAGES = [{"role": "user", "content":
                        "Copy this line exactly, three times:\n"
                        "one two three four five six seven eight nine ten\n"
                        "one two three four five six seven eight nine ten\n"
                        "one two three four five six seven eight nine ten\n"}]

# The sampled stage's request shape; every sampling field explicit because
# omitted ones are filled from the server's generation_config.
# A typical deployment's sampling. Callers pass ``primary=`` to match their stage.
DEFAULT_PRIMARY = {"temperature": 0.7, "top_p": 0.8, "top_k": 20}
PRIMARY_SEED = 20240
PROBE_MAX_TOKENS = 8          # tiny probes: the rehearsal must cost nothing
SPEC_MAX_TOKENS = 24          # enough decode steps for an n-gram drafter to fire
CONTEXT_REFUSAL_RE = re.compile(
    r"maximum context length|context length is only|maximum model length|max_model_len|context length",
    re.IGNORECASE)
TOKEN_ID_KEY_RE = re.compile(r"^token_id:-?\d+$")
SPEC_COUNTERS = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total")
REPORTED_COUNTERS = SPEC_COUNTERS + ("vllm:spec_decode_num_accepted_tokens_total",
                                     "vllm:generation_tokens_total", "vllm:prompt_tokens_total")


class PreflightError(RuntimeError):
    """A preflight FAILed; ``.result`` holds the full record."""

    def __init__(self, message: str, result: dict):
        super().__init__(message)
        self.result = result


def fresh_salt() -> str:
    # A new salt per request keeps the prefix cache from answering a probe
    # with state left over from an earlier one.
    return uuid.uuid4().hex


def primary_chat_body(model: str, messages: list, *, seed: int, max_tokens: int,
                      primary: dict | None = None, cache_salt: str | None = None) -> dict:
    body = {"model": model, "messages": messages, "seed": seed, "max_tokens": max_tokens,
            **(primary if primary is not None else DEFAULT_PRIMARY)}
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    return body


class _Probe:
    """Accumulates one probe's calls; ``finish`` turns it into the record."""

    def __init__(self, name: str, endpoint: Endpoint):
        self.name = name
        self.ep = endpoint
        self.calls: list[dict] = []
        self.facts: dict = {}

    def call(self, method: str, path: str, body: dict | None = None, *, summary: Any = None,
             without_key: bool = False) -> dict:
        res = (self.ep.get_json(path, without_key=without_key) if method == "GET"
               else self.ep.post_json(path, body or {}))
        self.calls.append({"method": method, "path": path, **({"without_key": True} if without_key else {}),
                           "request": summary if summary is not None else body,
                           "request_sha256": sha256_json(body) if body is not None else None,
                           "status": res["status"], "body": res["body"], "error": res["error"],
                           "elapsed_s": res["elapsed_s"], "started_at": res["started_at"]})
        return res

    def finish(self, ok: bool, reason: str) -> dict:
        last = self.calls[-1] if self.calls else {}
        return {"name": self.name, "pass": bool(ok), "reason": reason, "status": last.get("status"),
                "body": last.get("body"), "error": last.get("error"), "calls": self.calls,
                "facts": self.facts}


def _no_answer(res: dict, what: str) -> str | None:
    """Reason string when ``res`` is not a 200 JSON object, else None."""
    if res["status"] is None:
        return f"{what}: no answer ({res['error']}); rerun"
    if res["status"] != 200:
        return f"{what}: HTTP {res['status']}: {error_message(res['body'])}"
    if not isinstance(res["body"], dict):
        return f"{what}: 200 but body is not a JSON object: {str(res['body'])[:200]!r}"
    return None


def _choice0(body: dict) -> dict | None:
    ch = body.get("choices")
    return ch[0] if isinstance(ch, list) and ch and isinstance(ch[0], dict) else None


# --- probes ------------------------------------------------------------------
# Each takes (probe, ctx) and returns (pass, reason). ctx carries what earlier
# probes learned (model, max_model_len, a valid token id).

def _p_health(p: _Probe, ctx: dict):
    res = p.call("GET", "/health")
    if res["status"] == 200:
        return True, "200"
    return False, f"/health: {res['error'] or res['status']}"


def _p_key_required(p: _Probe, ctx: dict):
    res = p.call("GET", "/v1/models", without_key=True)
    if res["status"] in (401, 403):
        return True, f"/v1/models without the key: HTTP {res['status']} (refused)"
    if res["status"] is None:
        return False, f"/v1/models without the key: no answer ({res['error']})"
    return False, (f"/v1/models without the key: HTTP {res['status']}, not refused: the server answers anything "
                   "on the host, not only the audit")


def _p_models(p: _Probe, ctx: dict):
    res = p.call("GET", "/v1/models")
    if r := _no_answer(res, "/v1/models"):
        return False, r
    data = res["body"].get("data")
    if not isinstance(data, list):
        return False, "/v1/models: no data list"
    ids = [c.get("id") for c in data if isinstance(c, dict)]
    p.facts["served_models"] = ids
    card = next((c for c in data if isinstance(c, dict) and c.get("id") == ctx["model"]), None)
    if card is None:
        return False, f"/v1/models does not list {ctx['model']!r} (lists {ids})"
    mml = card.get("max_model_len")
    p.facts["max_model_len"] = mml
    if not isinstance(mml, int) or isinstance(mml, bool) or mml <= 0:
        return False, f"model card has no usable max_model_len ({mml!r})"
    if ctx["spec_max_model_len"] is not None and mml != ctx["spec_max_model_len"]:
        return False, f"max_model_len is {mml}, spec says {ctx['spec_max_model_len']}"
    ctx["max_model_len"] = mml
    return True, f"lists {ctx['model']!r}, max_model_len {mml}"


def _p_tokenize(p: _Probe, ctx: dict):
    # add_special_tokens=False: a BOS added by tokenize would come back from
    # detokenize and make a faithful tokenizer look broken.
    tok = p.call("POST", "/tokenize", {"model": ctx["model"], "prompt": ROUNDTRIP_TEXT,
                                       "add_special_tokens": False})
    if r := _no_answer(tok, "/tokenize"):
        return False, r
    ids = tok["body"].get("tokens")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool)
                                                        for i in ids):
        return False, f"/tokenize: tokens is not a non-empty list of ints: {ids!r}"
    p.facts["token_count"] = len(ids)
    if tok["body"].get("count") not in (None, len(ids)):
        return False, f"/tokenize: count {tok['body'].get('count')} != len(tokens) {len(ids)}"
    t_mml = tok["body"].get("max_model_len")
    if t_mml is not None and t_mml != ctx["max_model_len"]:
        return False, f"/tokenize says max_model_len {t_mml}, /v1/models says {ctx['max_model_len']}"
    ctx["token_id"] = ids[0]
    de = p.call("POST", "/detokenize", {"model": ctx["model"], "tokens": ids})
    if r := _no_answer(de, "/detokenize"):
        return False, r
    text = de["body"].get("prompt")
    p.facts["roundtrip_equal"] = text == ROUNDTRIP_TEXT
    if text != ROUNDTRIP_TEXT:
        return False, f"round trip changed the text: {ROUNDTRIP_TEXT!r} -> {text!r}"
    return True, f"{len(ids)} tokens, text restored exactly"


def _p_logprobs20(p: _Probe, ctx: dict):
    n = 4
    body = {"model": ctx["model"], "prompt": COMPLETION_PROMPT, "max_tokens": n, "temperature": 0.0,
            "logprobs": 20, "return_tokens_as_token_ids": True, "ignore_eos": True,
            "cache_salt": fresh_salt()}
    res = p.call("POST", "/v1/completions", body)
    if r := _no_answer(res, "logprobs=20 completion"):
        return False, r
    ch = _choice0(res["body"])
    lp = ch.get("logprobs") if ch else None
    if not isinstance(lp, dict):
        return False, "no logprobs block in choices[0]"
    tops, toks = lp.get("top_logprobs"), lp.get("tokens")
    if not isinstance(tops, list) or not isinstance(toks, list):
        return False, "logprobs block lacks tokens/top_logprobs lists"
    out_n = (res["body"].get("usage") or {}).get("completion_tokens")
    p.facts.update(positions=len(tops), completion_tokens=out_n, tokens=toks)
    if len(tops) != n or len(toks) != n or out_n != n:
        return False, f"expected {n} positions (ignore_eos), got top_logprobs {len(tops)}, tokens {len(toks)}, " \
                      f"usage.completion_tokens {out_n}"
    bad_tok = [t for t in toks if not (isinstance(t, str) and TOKEN_ID_KEY_RE.match(t))]
    if bad_tok:
        return False, f"tokens not in token_id:N form: {bad_tok[:3]}"
    for i, entry in enumerate(tops):
        if not isinstance(entry, dict) or len(entry) < 20:
            return False, f"position {i}: {len(entry) if isinstance(entry, dict) else entry!r} top entries, need >= 20"
        bad = [k for k in entry if not TOKEN_ID_KEY_RE.match(str(k))]
        if bad:
            return False, f"position {i}: keys not in token_id:N form (string keys collapse ties): {bad[:3]}"
        vals = list(entry.values())
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v) and v <= 1e-6
                   for v in vals):
            return False, f"position {i}: logprob values not all numbers <= 0"
    return True, f"{n} positions x >= 20 token_id keys"


def _p_prompt_logprobs(p: _Probe, ctx: dict):
    body = {"model": ctx["model"], "prompt": COMPLETION_PROMPT, "max_tokens": 1, "temperature": 0.0,
            "prompt_logprobs": 1, "cache_salt": fresh_salt()}
    res = p.call("POST", "/v1/completions", body)
    if r := _no_answer(res, "prompt_logprobs completion"):
        return False, r
    ch = _choice0(res["body"])
    pl = ch.get("prompt_logprobs") if ch else None
    n_prompt = (res["body"].get("usage") or {}).get("prompt_tokens")
    p.facts.update(entries=len(pl) if isinstance(pl, list) else None, prompt_tokens=n_prompt)
    if not isinstance(pl, list) or not pl:
        return False, "choices[0].prompt_logprobs missing or empty"
    if n_prompt is not None and len(pl) != n_prompt:
        return False, f"{len(pl)} prompt_logprobs entries for {n_prompt} prompt tokens"
    # The first prompt token has no context, so vLLM gives None there.
    if not all(isinstance(e, dict) and e for e in pl[1:]):
        return False, "prompt_logprobs entries after the first are not all non-empty objects"
    return True, f"{len(pl)} entries for {n_prompt} prompt tokens"


def _chat_outcome(res: dict) -> dict:
    ch = _choice0(res["body"]) or {}
    msg = chat_message(ch)
    return {"text": msg["content"], "reasoning": msg["reasoning"], "finish_reason": ch.get("finish_reason"),
            "completion_tokens": (res["body"].get("usage") or {}).get("completion_tokens")}


def _p_seeded_repeat(p: _Probe, ctx: dict):
    outcomes = []
    for _ in range(2):
        # Same body but for the salt, as in the sampled stage where each
        # request gets a fresh one: the seed alone must fix the output.
        body = primary_chat_body(ctx["model"], SEEDED_MESSAGES, seed=PRIMARY_SEED,
                                 max_tokens=PROBE_MAX_TOKENS, primary=ctx["primary"], cache_salt=fresh_salt())
        res = p.call("POST", "/v1/chat/completions", body)
        if r := _no_answer(res, "seeded chat completion"):
            return False, r
        outcomes.append(_chat_outcome(res))
    p.facts["outcomes"] = outcomes
    p.facts["body_sha256_without_salt"] = [
        sha256_json({k: v for k, v in c["request"].items() if k != "cache_salt"}) for c in p.calls]
    if outcomes[0]["text"] is None and outcomes[0]["reasoning"] is None:
        return False, "no choices[0].message.content (nor reasoning)"
    if outcomes[0] != outcomes[1]:
        return False, f"same seed, different outputs: {outcomes[0]!r} vs {outcomes[1]!r}"
    return True, "identical text, finish_reason and token count"


def _p_max_model_len(p: _Probe, ctx: dict):
    # max_model_len + 1 prompt tokens: refused by every vLLM release, before
    # any compute. Older releases refuse prompt + max_tokens > max_model_len;
    # 0.32 refuses only a prompt longer than max_model_len and silently lowers
    # max_tokens otherwise, so a shorter over-long request would prove nothing
    # there (the clamp is detected on every answer instead: client.clamping).
    L, max_tokens, tid = ctx["max_model_len"], 1, ctx["token_id"]
    n = L + 1
    body = {"model": ctx["model"], "prompt": [tid] * n, "max_tokens": max_tokens, "temperature": 0.0,
            "cache_salt": fresh_salt()}
    summary = {**body, "prompt": f"<{n} x token id {tid}>"}
    p.facts.update(max_model_len=L, prompt_tokens=n, max_tokens=max_tokens)
    res = p.call("POST", "/v1/completions", body, summary=summary)
    if res["status"] is None:
        return False, f"no answer ({res['error']}); rerun"
    if res["status"] == 200:
        usage = res["body"].get("usage") if isinstance(res["body"], dict) else None
        return False, (f"{n} prompt tokens > max_model_len {L} was accepted (usage {usage}): the server "
                       "does not enforce the context length it reports")
    msg = error_message(res["body"])
    if res["status"] != 400:
        return False, f"expected 400, got HTTP {res['status']}: {msg}"
    if not CONTEXT_REFUSAL_RE.search(msg):
        return False, f"400 does not mention the context length: {msg!r}"
    p.facts["refusal"] = msg
    return True, f"refused with 400: {msg[:200]}"


def _p_known_bad(p: _Probe, ctx: dict):
    body = {"model": ctx["model"], "prompt": COMPLETION_PROMPT, "max_tokens": 1, "temperature": 0.0,
            "logprobs": 21, "cache_salt": fresh_salt()}
    res = p.call("POST", "/v1/completions", body)
    if res["status"] is None:
        return False, f"no answer ({res['error']}); rerun"
    msg = error_message(res["body"])
    if res["status"] != 400:
        return False, f"logprobs=21 must be refused with 400, got HTTP {res['status']}: {msg[:300]}"
    if not msg:
        return False, "400 without an error message in the body"
    return True, f"400: {msg[:200]}"


def _spec_probe(moving: bool) -> Callable:
    def probe(p: _Probe, ctx: dict):
        before_res = p.call("GET", "/metrics")
        if r := _metrics_unusable(before_res):
            return False, r
        body = primary_chat_body(ctx["model"], REPETITIVE_MESSAGES, seed=PRIMARY_SEED,
                                 max_tokens=SPEC_MAX_TOKENS, primary=ctx["primary"], cache_salt=fresh_salt())
        res = p.call("POST", "/v1/chat/completions", body)
        if r := _no_answer(res, "primary-shape chat completion"):
            return False, r
        after_res = p.call("GET", "/metrics")
        if r := _metrics_unusable(after_res):
            return False, r
        before, after = metrics(before_res["body"]), metrics(after_res["body"])
        delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in REPORTED_COUNTERS}
        p.facts.update(delta=delta, before={k: before.get(k) for k in REPORTED_COUNTERS},
                       after={k: after.get(k) for k in REPORTED_COUNTERS},
                       completion_tokens=(res["body"].get("usage") or {}).get("completion_tokens"))
        moved = {k: delta[k] for k in SPEC_COUNTERS}
        if moving:
            missing = [k for k in SPEC_COUNTERS if k not in after]
            if missing:
                return False, f"speculative arm but /metrics lacks {missing}"
            if not all(v > 0 for v in moved.values()):
                return False, f"speculative arm but counters did not move on the primary request shape: {moved}"
            return True, f"counters moved: {moved}"
        if any(v != 0 for v in moved.values()):
            return False, f"non-speculative arm but spec counters moved: {moved}"
        return True, f"spec counters still: {moved}"
    return probe


def _metrics_unusable(res: dict) -> str | None:
    if res["status"] != 200:
        return f"/metrics: {res['error'] or res['status']}"
    if not isinstance(res["body"], str):
        return "/metrics: body is not Prometheus text"
    return None


def _no_server_answer(p: _Probe) -> bool:
    last = p.calls[-1] if p.calls else {}
    status = last.get("status")
    return status is None or status >= 500


def health_after(endpoint: Endpoint, *, wait_s: float = 15.0, poll_s: float = 0.5) -> dict:
    """Is the server still up after a failure?  Polls /health until it fails or ``wait_s`` passes.

    A dying vLLM answers its last 500 and then closes its socket within
    seconds; a server that stays healthy for ``wait_s`` is taken as alive.
    """
    t0 = time.monotonic()
    polls = 0
    while True:
        res = endpoint.get_json("/health", timeout_s=min(5.0, endpoint.timeout_s))
        polls += 1
        last = res["error"] or f"HTTP {res['status']}"
        if res["status"] != 200:
            return {"alive": False, "polls": polls, "waited_s": round(time.monotonic() - t0, 3),
                    "last": f"/health: {last}"}
        if time.monotonic() - t0 >= wait_s:
            return {"alive": True, "polls": polls, "waited_s": round(time.monotonic() - t0, 3),
                    "last": "/health: HTTP 200"}
        time.sleep(poll_s)


PROBES: list[tuple[str, Callable]] = [
    ("health", _p_health),
    ("models", _p_models),
    ("tokenize_roundtrip", _p_tokenize),
    ("completion_logprobs20", _p_logprobs20),
    ("prompt_logprobs", _p_prompt_logprobs),
    ("seeded_repeat", _p_seeded_repeat),
    ("max_model_len", _p_max_model_len),
    ("known_bad_400", _p_known_bad),
]


KEY_PROBE = ("api_key_required", _p_key_required)


def _probes(speculative: bool, keyed: bool) -> list[tuple[str, Callable]]:
    first, rest = PROBES[:1], PROBES[1:]
    return (first + ([KEY_PROBE] if keyed else []) + rest
            + [("spec_counters_move", _spec_probe(True)) if speculative
               else ("spec_counters_still", _spec_probe(False))])


def probe_names(speculative: bool, keyed: bool = False) -> list[str]:
    """The probes in order; ``keyed``: the arm is reached with an API key."""
    return [n for n, _ in _probes(speculative, keyed)]


def run_preflight(endpoint: Endpoint, spec: ArmSpec, *, primary: dict | None = None) -> dict:
    """Run the probes in order against ``endpoint``; stop at the first failure.

    ``spec`` is the arm's spec; used: ``arm``, ``served_model_name``,
    ``max_model_len`` (None = discover), ``speculative``. ``primary``
    overrides the sampling fields of the primary request shape (default
    ``DEFAULT_PRIMARY``).
    """
    model = spec.served_model_name
    speculative = spec.speculative
    ctx = {"model": model, "spec_max_model_len": spec.max_model_len, "max_model_len": None,
           "token_id": None, "primary": primary if primary is not None else DEFAULT_PRIMARY}
    probes = _probes(speculative, endpoint.keyed)
    result: dict = {"schema": PREFLIGHT_SCHEMA, "arm": spec.arm, "url": endpoint.base_url, "model": model,
                    "speculative": speculative, "primary": ctx["primary"], "max_model_len": None,
                    "verdict": None, "failed_probe": None, "server_alive_after": None,
                    "started_at": utc_now("milliseconds"), "finished_at": None, "probes": []}
    for name, fn in probes:
        p = _Probe(name, endpoint)
        try:
            ok, reason = fn(p, ctx)
        except Exception as exc:  # a malformed reply must FAIL the probe, not crash the stage
            ok, reason = False, f"probe crashed on the reply: {type(exc).__name__}: {exc}"
        if not ok and _no_server_answer(p):
            # A 5xx or a dropped connection may have taken the server with it
            # (vLLM's engine dies on some kernel faults): say so, it is evidence.
            p.facts["after_failure"] = health_after(endpoint)
            result["server_alive_after"] = p.facts["after_failure"]["alive"]
            if not p.facts["after_failure"]["alive"]:
                reason += f"; the server then went down ({p.facts['after_failure']['last']})"
        result["probes"].append(p.finish(ok, reason))
        if not ok:
            result["failed_probe"] = name
            break
    result["max_model_len"] = ctx["max_model_len"]
    result["verdict"] = "FAIL" if result["failed_probe"] else "PASS"
    result["finished_at"] = utc_now("milliseconds")
    return result


def require_pass(result: dict) -> dict:
    """Return ``result`` if PASS, else raise ``PreflightError`` naming the probe and the server's body."""
    if result.get("verdict") == "PASS":
        return result
    name = result.get("failed_probe")
    probe: dict = next((p for p in result.get("probes", []) if p["name"] == name), {})
    body = probe.get("body")
    shown = body if isinstance(body, str) else canonical_json(body)
    raise PreflightError(f"preflight of arm {result.get('arm')!r} failed at probe {name!r}: "
                         f"{probe.get('reason')} [HTTP {probe.get('status')}; server body: {shown[:2000]}]",
                         result)
