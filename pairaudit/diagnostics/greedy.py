"""Greedy runs, first-divergence, forced-prefix probes and repeatability.

When the candidate's greedy output differs from the control's, save enough
to decide whether the flip is a one-step tie on the BF16 logit grid
(rules.grid_tie_v1) and not a state/verifier bug: every top-20 id with its
unrounded value, both compared ids, and the token counts of the forced
prefixes. A fresh salt for every greedy generation and a different one for
its forced-prefix probe.

Why completions with token-id prompts: /tokenize renders the chat template
once, and both arms then get the identical token prompt, so a divergence
cannot come from two template renderings. Chat keeps only the first
``top_logprobs`` entries (a sampled token outside them displaces the last),
so top-20 comes from completions with ``return_tokens_as_token_ids`` (keys
``token_id:N``; decoded strings collide).

Nothing here raises on an HTTP failure except ``prompt_ids`` (no prompt, no
run): errors are recorded next to the server's body and the rules STOP on
the missing evidence.

Records (plain JSON dicts): ``greedy_one`` writes ``contracts.GreedyRecord``
(the diagnostics phase's ``GreedyPlan`` runs it for every item and
determinism repeat, one at a time), ``run_probe`` ``contracts.ProbeResult``
(``divergence.probe_arm``) and ``divergence_records``
``contracts.DivergenceRecord``.
"""

from __future__ import annotations

import secrets
from typing import Any, Mapping, Sequence

from pairaudit.core.artifacts import sha256_json
from pairaudit.core.contracts import DivergenceRecord, GreedyRecord, ProbeResult
from pairaudit.serving.client import Endpoint, clamping

TOP_K_LOGPROBS = 20  # vLLM's default max_logprobs; 21 is refused
TOKEN_ID_PREFIX = "token_id:"


class GreedyError(RuntimeError):
    """A prerequisite call failed (no prompt ids): nothing can be run."""


def fresh_salt() -> str:
    # 128 random bits: no two generations (or a generation and its probe)
    # can share a prefix-cache entry, so no request is answered from stale KV.
    return secrets.token_hex(16)


# ----------------------------------------------------------------- prompts

def prompt_ids(endpoint: Endpoint, model: str, messages: list, chat_template_kwargs: dict | None = None) -> list[int]:
    """The chat prompt's token ids as the server's own template renders them."""
    body: dict[str, Any] = {"model": model, "messages": messages, "add_generation_prompt": True}
    if chat_template_kwargs:
        body["chat_template_kwargs"] = dict(chat_template_kwargs)
    res = endpoint.post_json("/tokenize", body)
    if res["error"] is not None:
        raise GreedyError(f"/tokenize at {endpoint.base_url} failed: {res['error']}; body: {res['body']!r}")
    ids = res["body"].get("tokens") if isinstance(res["body"], dict) else None
    if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise GreedyError(f"/tokenize at {endpoint.base_url} returned no token ids: {res['body']!r}")
    return ids


# ------------------------------------------------------------------ bodies

def _completion_body(model: str, prompt: list[int], *, max_tokens: int, salt: str) -> dict:
    # Every sampling field explicit: an omitted one is filled from the
    # server's generation_config, which may differ between arms and builds.
    # Neutral penalties/min_p keep speculative decoding eligible in vLLM
    # (its check is "!= neutral"), so the candidate really runs its change.
    return {
        "model": model,
        "prompt": list(prompt),
        "max_tokens": max_tokens,
        "min_tokens": 0,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "seed": 0,
        "n": 1,
        "stop": [],
        "stop_token_ids": [],
        "ignore_eos": False,  # natural EOS
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "repetition_penalty": 1.0,
        "skip_special_tokens": True,
        "logprobs": TOP_K_LOGPROBS,
        "return_tokens_as_token_ids": True,
        "echo": False,
        "stream": False,
        "cache_salt": salt,
    }


def greedy_body(model: str, prompt_ids: list[int], *, max_tokens: int, salt: str) -> dict:
    """A greedy completion over token ids with top-20 logprobs per generated position."""
    return _completion_body(model, prompt_ids, max_tokens=max_tokens, salt=salt)


def probe_body(model: str, forced_ids: list[int], salt: str) -> dict:
    """One greedy step after prompt + forced prefix: the top-20 at the divergent position."""
    return _completion_body(model, forced_ids, max_tokens=1, salt=salt)


def request_sha256(body: dict) -> str:
    # The arms may serve different model ids and every generation has its own
    # salt by design; what must match across arms is everything else.
    return sha256_json({k: v for k, v in body.items() if k not in ("model", "cache_salt")})


# --------------------------------------------------------------- responses

def parse_token_key(key: str) -> int:
    """``token_id:N`` -> N; anything else means the server ignored return_tokens_as_token_ids."""
    if not isinstance(key, str) or not key.startswith(TOKEN_ID_PREFIX):
        raise ValueError(f"logprobs key {key!r} is not 'token_id:N' (return_tokens_as_token_ids ignored?)")
    tail = key[len(TOKEN_ID_PREFIX):]
    if not tail.isdigit():
        raise ValueError(f"logprobs key {key!r} has no integer token id")
    return int(tail)


def parse_top(entry: Mapping[str, float] | None) -> list[list]:
    """One position's top_logprobs dict -> [[id, logprob], ...] in the served order.

    Values are kept exactly as served (JSON floats round-trip FP32 values),
    never rounded or re-sorted: the grid rule needs the raw numbers.
    """
    if not isinstance(entry, Mapping):
        raise ValueError(f"top_logprobs entry {entry!r} is not an object")
    return [[parse_token_key(k), v] for k, v in entry.items()]


def parse_completion(body: Any) -> dict:
    """The facts a greedy record keeps from a 200 completions body.

    Raises ValueError on a malformed body; the caller records it as an error.
    """
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list) or not body["choices"]:
        raise ValueError("completions response has no choices")
    ch = body["choices"][0]
    lp = ch.get("logprobs")
    if not isinstance(lp, dict) or not isinstance(lp.get("tokens"), list):
        raise ValueError("completions response has no logprobs.tokens")
    ids = [parse_token_key(t) for t in lp["tokens"]]
    tops = lp.get("top_logprobs")
    if not isinstance(tops, list) or len(tops) != len(ids):
        raise ValueError(f"top_logprobs covers {len(tops) if isinstance(tops, list) else None} "
                         f"positions, tokens {len(ids)}")
    usage = body.get("usage")
    n = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if n != len(ids):
        # The hashes and divergence positions are computed on these ids, so
        # they must be every token the server generated.
        raise ValueError(f"logprobs cover {len(ids)} tokens but usage.completion_tokens={n!r}")
    return {"token_ids": ids, "top20": [parse_top(t) for t in tops], "text": ch.get("text"),
            "finish_reason": ch.get("finish_reason"), "usage": usage}


def _post_completion(endpoint: Endpoint, body: dict) -> tuple[dict, dict]:
    """(HttpResult, parsed facts or {}); a parse failure becomes the result's error."""
    res = endpoint.post_json("/v1/completions", body)
    parsed: dict = {}
    if res["error"] is None:
        try:
            parsed = parse_completion(res["body"])
        except (ValueError, TypeError, AttributeError) as exc:
            res = {**res, "error": f"malformed completion: {exc}"}
    return res, parsed


# ------------------------------------------------------------------ greedy

def greedy_one(endpoint: Endpoint, model: str, ids: list[int], *, max_tokens: int, index: Any = None) -> GreedyRecord:
    salt = fresh_salt()
    body = greedy_body(model, ids, max_tokens=max_tokens, salt=salt)
    res, parsed = _post_completion(endpoint, body)
    token_ids = parsed.get("token_ids", [])
    clamp = clamping(body, parsed.get("finish_reason"), parsed.get("usage"))
    return {
        "index": index,
        "body": body,
        "body_sha256": sha256_json(body),
        "request_sha256": request_sha256(body),
        "status": res["status"],
        "error": res["error"],
        # On an error the server's own words are the evidence.
        "response_body": res["body"] if res["error"] is not None else None,
        "token_ids": token_ids,
        "text": parsed.get("text"),
        "finish_reason": parsed.get("finish_reason"),
        "top20": parsed.get("top20", []),
        "usage": parsed.get("usage"),
        "salt": salt,
        "output_sha256": sha256_json(token_ids) if res["error"] is None else None,
        "clamped": clamp["clamped"],
        "clamp": clamp if clamp["clamped"] else None,
        "timings": {"started_at": res["started_at"], "elapsed_s": res["elapsed_s"]},
    }


# -------------------------------------------------------------- divergence

def first_divergence(a_ids: Sequence[int], b_ids: Sequence[int]) -> int | None:
    """First position whose token ids differ; None when the sequences are equal.

    Compared on ids, never text: two ids can decode to the same string. When
    one output is a strict prefix of the other, they diverge where the
    shorter ends (one arm stopped, the other did not).
    """
    for k, (a, b) in enumerate(zip(a_ids, b_ids)):
        if a != b:
            return k
    if len(a_ids) != len(b_ids):
        return min(len(a_ids), len(b_ids))
    return None


def prefix_equal(a_ids: Sequence[int], b_ids: Sequence[int], k: int) -> bool:
    """Both outputs really share their first k ids (what the probes will force)."""
    return len(a_ids) >= k and len(b_ids) >= k and list(a_ids[:k]) == list(b_ids[:k])


def _at(seq: Sequence, k: int | None):
    return seq[k] if k is not None and 0 <= k < len(seq) else None


def divergence_records(control_greedy: Sequence[GreedyRecord],
                       candidate_greedy: Sequence[GreedyRecord]) -> list[DivergenceRecord]:
    """Pair the two arms' greedy records by item index and locate each first divergence."""
    ctrl = {r["index"]: r for r in control_greedy}
    cand = {r["index"]: r for r in candidate_greedy}
    if len(ctrl) != len(control_greedy) or len(cand) != len(candidate_greedy):
        raise ValueError("duplicate item index in greedy records")
    if set(ctrl) != set(cand):
        raise ValueError(f"greedy arms cover different items: control-only {sorted(set(ctrl) - set(cand), key=repr)}, "
                         f"candidate-only {sorted(set(cand) - set(ctrl), key=repr)}")
    out: list[DivergenceRecord] = []
    for idx in ctrl:  # the control's order: items stay in the order they were run
        a, b = ctrl[idx], cand[idx]
        errs = [f"{arm}: {r['error']}" for arm, r in (("control", a), ("candidate", b)) if r.get("error")]
        a_ids, b_ids = list(a.get("token_ids") or []), list(b.get("token_ids") or [])
        k = None if errs else first_divergence(a_ids, b_ids)
        cut = [(arm, r) for arm, r, ids in (("control", a, a_ids), ("candidate", b, b_ids))
               if r.get("clamped") and k is not None and len(ids) == k]
        if not errs and cut:
            # Equal up to where the server cut an arm short: what it would
            # have generated next is unknown, so neither "diverged" nor "equal".
            errs = [f"clamped: {arm}: {(r.get('clamp') or {}).get('reason')}" for arm, r in cut]
        known = not errs  # no output, no comparison: an unknown, never "no divergence"
        out.append({
            "index": idx, "control_len": len(a_ids), "candidate_len": len(b_ids),
            "clamped": [arm for arm, r in (("control", a), ("candidate", b)) if r.get("clamped")],
            "error": "; ".join(errs) or None,
            "diverged": (k is not None) if known else None,
            "first_divergence": k if known else None,
            "control_token_id": _at(a_ids, k) if known else None,
            "candidate_token_id": _at(b_ids, k) if known else None,
            "shared_prefix": a_ids[:k] if known and k is not None else None,
            "prefix_equal": known and prefix_equal(a_ids, b_ids, k if k is not None else len(a_ids)),
            "control_greedy_top": _at(a.get("top20") or [], k) if known else None,
            "candidate_greedy_top": _at(b.get("top20") or [], k) if known else None,
        })
    return out


def comparison_counts(items: Sequence[Any], divergences: Sequence[DivergenceRecord]) -> dict:
    """How many greedy items were selected, compared, diverged, or could not be compared.

    items: the greedy selection's indices (the divergence artifact's
    ``items``); divergences: ``divergence_records`` for them. An item is
    compared when both arms' outputs exist and were compared on token ids
    (``diverged`` True or False); ``diverged`` None (a failed run, or two
    different prompt renderings) is not a comparison. grid-tie-v1 needs these
    counts: zero divergences over zero comparisons is not evidence.
    """
    known = {str(i) for i in items}
    stray = [d.get("index") for d in divergences if str(d.get("index")) not in known]
    if stray:
        raise ValueError(f"divergence records for items outside the selection: {stray}")
    return {"selected": len(items),
            "compared": sum(1 for d in divergences if d.get("diverged") is not None),
            "diverged": sum(1 for d in divergences if d.get("diverged") is True),
            "unresolved": sum(1 for d in divergences if d.get("diverged") is None)}


# ------------------------------------------------------------------- probes

def run_probe(endpoint: Endpoint, model: str, prompt_ids: Sequence[int], prefix: Sequence[int]) -> ProbeResult:
    """Top-20 after prompt + forced prefix, with a salt of its own (never the generation's)."""
    forced = list(prompt_ids) + list(prefix)
    salt = fresh_salt()
    body = probe_body(model, forced, salt)
    res, parsed = _post_completion(endpoint, body)
    top = parsed.get("top20") or []
    usage = parsed.get("usage") or {}
    return {
        "top20": top[0] if top else None,
        "token_id": parsed["token_ids"][0] if parsed.get("token_ids") else None,
        "salt": salt,
        "body": body,
        "body_sha256": sha256_json(body),
        "status": res["status"],
        "error": res["error"],
        "response_body": res["body"] if res["error"] is not None else None,
        "prompt_tokens": usage.get("prompt_tokens"),
        "sent_prompt_len": len(forced),
        "timings": {"started_at": res["started_at"], "elapsed_s": res["elapsed_s"]},
    }


def _by_index(probes: Mapping | Sequence[Mapping] | None) -> dict:
    if probes is None:
        return {}
    if isinstance(probes, Mapping):
        return {str(k): v for k, v in probes.items()}
    return {str(p["index"]): p for p in probes}


def grid_tie_inputs(divergences: Sequence[DivergenceRecord], control_probes, candidate_probes) -> list[dict]:
    """The exact per-probe input records of ``rules.grid_tie_v1``, one per divergent item.

    Compared ids come from the greedy outputs; the top lists and prefix
    lengths from the probes. A divergent item whose probe failed or is
    missing is still listed, with None evidence, so the rule STOPs on it
    instead of the divergence quietly vanishing.
    """
    ctrl, cand = _by_index(control_probes), _by_index(candidate_probes)
    out = []
    for d in divergences:
        if not d.get("diverged"):
            continue
        cp, kp = ctrl.get(str(d["index"])) or {}, cand.get(str(d["index"])) or {}
        out.append({
            "index": d["index"],
            "control_token_id": d["control_token_id"],
            "candidate_token_id": d["candidate_token_id"],
            "candidate_top": kp.get("top20") if not kp.get("error") else None,
            "control_top": cp.get("top20") if not cp.get("error") else None,
            # Token counts of the two forced prefixes (prompt + shared prefix)
            # as each server counted them, not as we sent them.
            "control_prefix_len": cp.get("prompt_tokens") if not cp.get("error") else None,
            "candidate_prefix_len": kp.get("prompt_tokens") if not kp.get("error") else None,
        })
    return out
