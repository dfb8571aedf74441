"""Boundary gate: long-context retrieval and the max_model_len-16 capacity tail.

A capacity defect seen in practice showed only with (max_model_len - 16) input
+ 16 output tokens: both arms returned the same wrong text. This stage runs
that case, its (max_model_len - 32) + 32 control, and retrieval at fractions
of max_model_len, in both arms, on each arm's answers-phase server.

The prompt is a haystack: seeded filler sentences (no digits) with planted
numbers at spread positions and a question asking for them in order, built
to an exact token count from the arm's own ``/tokenize`` and sent as token
ids (text prompts get a character-count pre-check in vLLM; ids make the
length exact at the boundary). A case is correct when the numbers in the
answer, in order, are exactly the planted values; boundary-v1 also demands a
natural EOS (finish_reason "stop").

Artifacts
---------
``results/<audit>/boundary/<arm>.json``::

    {"schema": "pairaudit.boundary/v1", "arm", "served_model_name",
     "max_model_len",                 # what the server reports (/v1/models), else the spec
     "params": {...},                 # the boundary config actually used (defaults filled)
     "cases": [case record, ...],     # in the order run
     "first_long": {"case", "prompt_tokens", "ttft_s", "input_tokens_per_s"} | None,
                                      # the first request of the process with >= max_model_len/2 prompt tokens
     "server": Server.facts(), "provenance"}

    case record: contracts.BoundaryCase

``results/<audit>/boundary/gate.json``::

    {"schema": "pairaudit.boundary_gate/v1",
     "gate": gates.boundary_v1(...),  # verdict PASS | FAIL | INCONCLUSIVE, reasons
     "max_model_len": {arm: int},
     "cases": [{"case", "kind", "planted", "expected", "identical_text": bool,
                "control": side, "candidate": side}],
        side = {"text", "finish_reason", "correct", "extracted", "prompt_tokens", "max_tokens",
                "usage_prompt_tokens", "ttft_s", "input_tokens_per_s", "status", "error", "error_body",
                "config_error"} | None (case not run in that arm)
     "first_long": {arm: first_long}, "provenance"}
"""

from __future__ import annotations

import logging
import random
import re
import secrets
from typing import Any, Callable, Mapping, Sequence

from pairaudit.core import defaults
from pairaudit.core.artifacts import sha256_json
from pairaudit.core.contracts import BoundaryCase
from pairaudit.core.progress import Progress
from pairaudit.serving import armspec
from pairaudit.serving.armspec import ArmSpec
from pairaudit.serving.client import Endpoint, clamping, error_message, safe_salt

log = logging.getLogger("pairaudit")


# Every default, the haystack's frame (SmolLM2's ChatML as text) included, is
# the schema's.
DEFAULTS: dict[str, Any] = defaults.section("boundary")
DEFAULT_PROMPT = DEFAULTS["prompt"]

ORDINALS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth"]
COUNT_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]

# Filler parts: no digits, so the only numbers in the prompt are the planted ones.
SUBJECTS = ["The river", "A small bird", "The old library", "The morning train", "A quiet garden",
            "The market square", "The mountain road", "A wooden boat", "The north wind", "An open window"]
VERBS = ["was calm", "moved slowly", "looked bright", "stayed empty", "felt warm", "seemed busy",
         "grew quiet", "turned green", "smelled of rain", "was full of voices"]
TIMES = ["in the morning", "after the rain", "during the festival", "before sunset", "at noon",
         "in the winter", "on that day", "late at night", "in early spring", "as usual"]


class BoundaryError(RuntimeError):
    """A prerequisite failed (tokenize, a prompt that cannot be built): the stage cannot run."""


# ------------------------------------------------------------------- config

def settings(cfg: Mapping[str, Any] | None, where: str = "boundary") -> dict:
    """The config with defaults filled in, checked: bad values name the key and what is allowed."""
    cfg = dict(cfg or {})
    unknown = sorted(set(cfg) - set(DEFAULTS))
    if unknown:
        raise armspec.ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(DEFAULTS)}")
    out = {**DEFAULTS, **cfg}
    out["prompt"] = {**DEFAULT_PROMPT, **(cfg.get("prompt") or {})}
    bad_p = sorted(set(out["prompt"]) - set(DEFAULT_PROMPT))
    if bad_p:
        raise armspec.ConfigError(f"{where}.prompt: unknown key(s) {bad_p}; allowed: {sorted(DEFAULT_PROMPT)}")

    def is_int(v):
        return isinstance(v, int) and not isinstance(v, bool)

    fr = out["fractions"]
    if not isinstance(fr, list) or not all(isinstance(f, (int, float)) and not isinstance(f, bool) and f > 0
                                           for f in fr):
        raise armspec.ConfigError(f"{where}.fractions: {fr!r}; allowed: a list of numbers > 0 (fractions of "
                                 "max_model_len; above 1 is refused by the server, on purpose in tests)")
    if not is_int(out["values"]) or not 1 <= out["values"] <= len(ORDINALS):
        raise armspec.ConfigError(f"{where}.values: {out['values']!r}; allowed: an integer 1..{len(ORDINALS)}")
    if not is_int(out["digits"]) or not 1 <= out["digits"] <= 9:
        raise armspec.ConfigError(f"{where}.digits: {out['digits']!r}; allowed: an integer 1..9")
    if not is_int(out["seed"]):
        raise armspec.ConfigError(f"{where}.seed: {out['seed']!r}; allowed: an integer")
    if not is_int(out["retrieval_max_tokens"]) or out["retrieval_max_tokens"] < 1:
        raise armspec.ConfigError(f"{where}.retrieval_max_tokens: {out['retrieval_max_tokens']!r}; "
                                 "allowed: an integer >= 1")
    to = out["tail_offsets"]
    if not isinstance(to, list) or not all(is_int(t) and t >= 1 for t in to):
        raise armspec.ConfigError(f"{where}.tail_offsets: {to!r}; allowed: a list of integers >= 1")
    t = out["request_timeout_s"]
    if isinstance(t, bool) or not isinstance(t, (int, float)) or t <= 0:
        raise armspec.ConfigError(f"{where}.request_timeout_s: {t!r}; allowed: a number > 0")
    for k in ("head", "plant", "question"):
        if not isinstance(out["prompt"][k], str):
            raise armspec.ConfigError(f"{where}.prompt.{k}: allowed: a string")
    if "{value}" not in out["prompt"]["plant"]:
        raise armspec.ConfigError(f"{where}.prompt.plant: must contain {{value}} (and may contain {{ordinal}})")
    return out


def case_plan(cfg: Mapping[str, Any], max_model_len: int) -> list[dict]:
    """Cases in run order: retrieval at each fraction, then each tail offset (input max-N, N output)."""
    plan = []
    for f in cfg["fractions"]:
        plan.append({"case": f"retrieval-{f:g}", "kind": "retrieval",
                     "prompt_tokens": int(round(f * max_model_len)), "max_tokens": cfg["retrieval_max_tokens"]})
    for n in cfg["tail_offsets"]:
        plan.append({"case": f"tail-{n}", "kind": "tail", "prompt_tokens": max_model_len - n, "max_tokens": n})
    names = [p["case"] for p in plan]
    if len(set(names)) != len(names):
        raise armspec.ConfigError(f"boundary: case names repeat {names}; fractions and tail_offsets must be distinct")
    return plan


# ----------------------------------------------------------------- haystack

def planted_values(seed: int, case: str, count: int, digits: int) -> list[int]:
    """Distinct values of exactly ``digits`` digits, the same in both arms for a case."""
    rng = random.Random(f"{seed}:{case}:values")
    lo, hi = 10 ** (digits - 1), 10 ** digits - 1
    if hi - lo + 1 < count:
        raise armspec.ConfigError(f"boundary: {count} distinct {digits}-digit values do not exist")
    return rng.sample(range(lo, hi + 1), count)


def spread_targets(body_len: int, count: int) -> list[int]:
    # Centres of `count` equal slices: first near the start, last near the end.
    return [int(body_len * (2 * i + 1) / (2 * count)) for i in range(count)]


def build_haystack(tokenize: Callable[[str], list[int]], n_tokens: int, *, values: Sequence[int], seed: int,
                   case: str, prompt: Mapping[str, str] = DEFAULT_PROMPT) -> dict:
    """A prompt of exactly ``n_tokens`` ids with ``values`` planted at spread positions, in order.

    ``tokenize(text) -> ids`` (no special tokens added). Filler is seeded by
    (seed, case); pieces are tokenized once each and concatenated, and the
    last filler sentence is cut to hit the count exactly. Raises BoundaryError
    when the frame and plants alone exceed ``n_tokens``.
    """
    k = len(values)
    cache: dict[str, list[int]] = {}

    def tok(s: str) -> list[int]:
        if s not in cache:
            cache[s] = list(tokenize(s))
        return cache[s]

    head = tok(prompt["head"])
    question = tok(prompt["question"].format(count=k, count_word=COUNT_WORDS[k] if k < len(COUNT_WORDS) else k))
    plants = [tok(prompt["plant"].format(ordinal=ORDINALS[i], value=v)) for i, v in enumerate(values)]
    body_len = n_tokens - len(head) - len(question) - sum(map(len, plants))
    if body_len < 0:
        raise BoundaryError(f"case {case}: {n_tokens} tokens cannot hold the frame and {k} planted values "
                            f"({n_tokens - body_len} tokens); use a larger length")
    rng = random.Random(f"{seed}:{case}:filler")
    filler: list[int] = []
    while len(filler) < body_len:
        filler += tok(f" {rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(TIMES)}.")
    filler = filler[:body_len]
    ids = list(head)
    positions, prev = [], 0
    for cut, p in zip(spread_targets(body_len, k), plants):
        ids += filler[prev:cut]
        positions.append(len(ids))
        ids += p
        prev = cut
    ids += filler[prev:] + question
    assert len(ids) == n_tokens, (len(ids), n_tokens)
    return {"ids": ids, "positions": positions, "planted": list(values), "head_tokens": len(head),
            "question_tokens": len(question), "plant_tokens": [len(p) for p in plants]}


_NUM = re.compile(r"\d+")


def extract_numbers(text: str | None) -> list[int]:
    return [int(m) for m in _NUM.findall(text or "")]


def endpoint_tokenizer(ep: Endpoint, model: str) -> Callable[[str], list[int]]:
    # The filler draws from 1,000 possible sentences, so the cases of one arm
    # repeat many: each distinct text is asked of the server once.
    known: dict[str, list[int]] = {}

    def tokenize(text: str) -> list[int]:
        if text in known:
            return list(known[text])
        res = ep.post_json("/tokenize", {"model": model, "prompt": text, "add_special_tokens": False})
        ids = res["body"].get("tokens") if isinstance(res["body"], dict) else None
        if res["error"] is not None or not isinstance(ids, list):
            raise BoundaryError(f"/tokenize at {ep.base_url} failed: {res['error']}; body: {res['body']!r}")
        known[text] = list(ids)
        return ids
    return tokenize


# ------------------------------------------------------------------ running

def request_body(model: str, ids: list[int], *, max_tokens: int, seed: int, salt: str) -> dict:
    # Every sampling field explicit: an omitted one would be the server's default.
    return {"model": model, "prompt": list(ids), "max_tokens": max_tokens, "min_tokens": 0,
            "temperature": 0.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "seed": seed, "n": 1,
            "stop": [], "stop_token_ids": [], "ignore_eos": False, "presence_penalty": 0.0,
            "frequency_penalty": 0.0, "repetition_penalty": 1.0, "skip_special_tokens": True,
            "echo": False, "cache_salt": salt}


def case_salt(salt_prefix: str, arm: str, case: str) -> str:
    # Random per request, not derived: an attached server outlives the job, and
    # a rerun with a derived salt would find its own prefix in the cache, so the
    # TTFT would no longer time a prefill. The audit/arm/case part is for
    # reading logs; vLLM refuses salts over 128 characters or with '/', so the
    # whole salt stays within 128 characters of [A-Za-z0-9_.-].
    return safe_salt(f"{salt_prefix}-{arm}-{case}", secrets.token_hex(12))


def run_case(ep: Endpoint, model: str, plan: Mapping[str, Any], cfg: Mapping[str, Any], *,
             tokenize: Callable[[str], list[int]], arm: str, salt_prefix: str,
             max_model_len: int | None = None) -> BoundaryCase:
    case = plan["case"]
    values = planted_values(cfg["seed"], case, cfg["values"], cfg["digits"])
    hay = build_haystack(tokenize, plan["prompt_tokens"], values=values, seed=cfg["seed"], case=case,
                         prompt=cfg["prompt"])
    body = request_body(model, hay["ids"], max_tokens=plan["max_tokens"], seed=cfg["seed"],
                        salt=case_salt(salt_prefix, arm, case))
    res = ep.stream_completion("/v1/completions", body, timeout_s=cfg["request_timeout_s"])
    usage = res.get("usage") or {}
    status = res["status"]
    config_error = None
    if status is not None and 400 <= status < 500:
        config_error = f"HTTP {status}: {error_message(res['body'])}"
    extracted = extract_numbers(res["text"]) if res["error"] is None else []
    ttft = res["ttft_s"]
    rec: BoundaryCase = {
        "case": case, "kind": plan["kind"], "prompt_tokens": len(hay["ids"]), "max_tokens": plan["max_tokens"],
        "planted": values, "expected": " ".join(map(str, values)), "positions": hay["positions"],
        "prompt_sha256": sha256_json(hay["ids"]),
        "request": {k: v for k, v in body.items() if k != "prompt"},
        "status": status, "text": res["text"], "finish_reason": res["finish_reason"], "usage": res.get("usage"),
        "usage_prompt_tokens": usage.get("prompt_tokens"), "extracted": extracted,
        "correct": res["error"] is None and extracted == values,
        "ttft_s": ttft, "e2el_s": res["e2el_s"],
        "input_tokens_per_s": (len(hay["ids"]) / ttft) if ttft else None,
        "error": res["error"], "error_body": res["body"], "config_error": config_error,
        "started_at": res["started_at"],
    }
    clamp = clamping(body, res["finish_reason"], res.get("usage"), max_model_len)
    rec["clamped"] = clamp["clamped"]
    rec["clamp"] = clamp if clamp["clamped"] else None
    if clamp["clamped"]:
        # The server lowered max_tokens instead of refusing (vLLM >= 0.32): the
        # answer was cut by the server, so it is never a correct boundary answer.
        rec["correct"] = False
        if clamp["over_context"]:
            # the case itself did not fit: the same configuration error an older
            # release reports with a 400
            rec["config_error"] = f"clamped by the server: {clamp['reason']}"
        else:
            rec["error"] = clamp["reason"]
    if res["error"] is None and rec["usage_prompt_tokens"] not in (None, len(hay["ids"])):
        # the server counted a different prompt than was built: the boundary was not where we think
        rec["correct"] = False
        rec["error"] = f"server counted {rec['usage_prompt_tokens']} prompt tokens, {len(hay['ids'])} were sent"
    return rec


def server_max_model_len(ep: Endpoint, spec: ArmSpec) -> int:
    res = ep.get_json("/v1/models")
    try:
        cards = res["body"]["data"]
        mml = next(c.get("max_model_len") for c in cards if c.get("id") == spec.served_model_name)
    except (TypeError, KeyError, StopIteration):
        mml = None
    mml = mml or spec.max_model_len
    if not isinstance(mml, int) or mml < 1:
        raise BoundaryError(f"max_model_len unknown: /v1/models gave {res['body']!r} and the arm sets none")
    return mml


def run_boundary(ep: Endpoint, model: str, max_model_len: int, cfg: Mapping[str, Any], *, arm: str,
                 salt_prefix: str, done: Mapping[str, BoundaryCase] | None = None,
                 record: Callable[[BoundaryCase], None] | None = None) -> dict:
    """Every case of the plan on one server; returns {"cases", "first_long"}.

    ``done`` holds cases answered by an earlier run (by case name): they are
    kept, not asked again.  ``record`` is called with each new case as soon
    as it is answered (the caller's journal).
    """
    tokenize = endpoint_tokenizer(ep, model)
    plan = case_plan(cfg, max_model_len)
    done = done or {}
    prog = Progress(len(plan), f"boundary {arm}", done=sum(1 for p in plan if p["case"] in done))
    cases: list[BoundaryCase] = []
    for p in plan:
        if p["case"] in done:
            kept = done[p["case"]].copy()
            kept.pop("key", None)  # the journal's, not the case's
            cases.append(kept)
            continue
        rec = run_case(ep, model, p, cfg, tokenize=tokenize, arm=arm, salt_prefix=salt_prefix,
                       max_model_len=max_model_len)
        if record is not None:
            record(rec)
        log.info("boundary %s %s: %d+%d tokens, status %s, finish %s, correct %s, ttft %s s, text %r",
                 arm, rec["case"], rec["prompt_tokens"], rec["max_tokens"], rec["status"], rec["finish_reason"],
                 rec["correct"], None if rec["ttft_s"] is None else round(rec["ttft_s"], 2), rec["text"])
        cases.append(rec)
        prog.step()
    first_long = next(({k: rec[k] for k in ("case", "prompt_tokens", "ttft_s", "input_tokens_per_s")}
                       for rec in cases if rec["ttft_s"] is not None and 2 * rec["prompt_tokens"] >= max_model_len),
                      None)
    return {"cases": cases, "first_long": first_long}
