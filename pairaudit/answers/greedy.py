"""Greedy runs of one arm, in its answers phase: every item of every dataset, and determinism repeats.

Each arm's greedy work is fixed before anything runs and needs nothing from
the other arm: a greedy run of every item (the superset of any selection the
diagnostics make from the paired table) and ``greedy.determinism_repeats``
repeats of the dataset's first item by index order (the same item in both
arms). It runs on the answers phase's own server, ``sampling.concurrency``
requests at a time, and every answer is journaled as it arrives
(``journal/greedy/<dataset>/<arm>.jsonl``): a rerun asks only what the
journal lacks.

Why completions with token-id prompts: /tokenize renders the chat template
once, and both arms then get the identical token prompt, so a divergence
cannot come from two template renderings. Chat keeps only the first
``top_logprobs`` entries (a sampled token outside them displaces the last),
so top-20 comes from completions with ``return_tokens_as_token_ids`` (keys
``token_id:N``; decoded strings collide). Every generated position keeps its
top-20 exactly as served: at an item's first divergence both arms share the
prefix, so each arm's own top-20 there is its distribution on the shared
prefix, the evidence grid-tie-v1 reads (``pairaudit.diagnostics``). A fresh
salt for every generation, so no request is answered from another's KV.

Nothing here raises on an HTTP failure except ``prompt_ids`` (no prompt, no
run): errors are recorded next to the server's body and the rules STOP on
the missing evidence; a run left without an answer (no status, a 429 or a
5xx) is the answers phase's server failure.

Records (plain JSON dicts): ``greedy_one`` writes ``contracts.GreedyRecord``;
``run_probe`` (one greedy step after a forced prefix, the switch bisection's
probe) ``contracts.ProbeResult``.
"""

from __future__ import annotations

import secrets
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Mapping, Sequence, cast

from pairaudit.answers.sampled import is_final
from pairaudit.core import lifecycle
from pairaudit.core.artifacts import sha256_json
from pairaudit.core.contracts import GreedyRecord, ProbeResult
from pairaudit.core.jsonlog import AppendLog, read_log
from pairaudit.core.progress import Progress
from pairaudit.serving.client import Endpoint, clamping

TOP_K_LOGPROBS = 20  # vLLM's default max_logprobs; 21 is refused
TOKEN_ID_PREFIX = "token_id:"


class GreedyError(RuntimeError):
    """A prerequisite call failed (no prompt ids): nothing can be run. ``status``: the server's, if it answered."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


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
        raise GreedyError(f"/tokenize at {endpoint.base_url} failed: {res['error']}; body: {res['body']!r}",
                          res["status"])
    ids = res["body"].get("tokens") if isinstance(res["body"], dict) else None
    if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise GreedyError(f"/tokenize at {endpoint.base_url} returned no token ids: {res['body']!r}", res["status"])
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



# ------------------------------------------------------------------- plan

GREEDY, DETERMINISM = "greedy", "determinism"


class GreedyPlan:
    """One dataset's greedy work on one arm, fixed before anything runs, and what its journal already holds.

    ``messages``: item index -> the item's chat messages (the sampled request
    bodies' or the dataset's; the same). Wanted: a greedy run of every item,
    then ``determinism_repeats`` repeats of the first item by index order.
    A journaled run counts only under the same key (max_tokens, the repeated
    item, the template's kwargs) and for the same messages, so a changed
    item or setting is asked again and nothing stale is used.
    """

    def __init__(self, name: str, messages: Mapping[Any, list], *, max_tokens: int, determinism_repeats: int,
                 chat_template_kwargs: Mapping[str, Any] | None, journal: Path):
        if not messages:
            raise ValueError(f"{name}: no items to run greedy on")
        self.name, self.journal, self.max_tokens = name, Path(journal), max_tokens
        self.messages = dict(messages)
        order = sorted(self.messages)
        self.det_index = order[0]
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.want: list[tuple[str, Any]] = [(GREEDY, i) for i in order] + [
            (DETERMINISM, r) for r in range(determinism_repeats)]
        self._wanted = set(self.want)
        self.key = {"max_tokens": max_tokens, "determinism_index": self.det_index,
                    "chat_template_kwargs": self.chat_template_kwargs}
        self._messages_sha = {i: sha256_json(m) for i, m in self.messages.items()}
        self.done: dict[tuple[str, Any], GreedyRecord] = {}
        self.last: dict[tuple[str, Any], GreedyRecord] = {}
        self.read()

    def index_of(self, run: str, slot: Any) -> Any:
        return slot if run == GREEDY else self.det_index

    def _matches(self, rec: Mapping[str, Any]) -> bool:
        w = (rec.get("run"), rec.get("slot"))
        if rec.get("key") != self.key or w not in self._wanted:
            return False
        return rec.get("messages_sha256") == self._messages_sha[self.index_of(*w)]

    def read(self) -> None:
        """What the journal holds for this plan: the first final answer of each run, and each run's last attempt."""
        for rec in cast(list[GreedyRecord], read_log(self.journal)):  # the journal holds what run() wrote
            if not self._matches(rec):
                continue
            w = (rec["run"], rec["slot"])
            self.last[w] = rec
            if is_final(rec):
                self.done.setdefault(w, rec)

    @property
    def todo(self) -> list[tuple[str, Any]]:
        return [w for w in self.want if w not in self.done]

    def run(self, srv: Any, journal: AppendLog, *, arm: str, concurrency: int) -> dict:
        """Ask every run the journal lacks, journaling each answer as it arrives: the items' greedy runs
        ``concurrency`` at a time, then the determinism repeats one at a time.

        ``srv``: the phase's running server (``serving.launch.Server``). A run
        left without an answer stays open (a rerun asks it again); an
        interrupt stops at once, queued runs are not sent.
        """
        todo = self.todo
        counts = {"runs": len(self.want), "from_journal": len(self.want) - len(todo), "asked": len(todo)}
        if not todo:
            return counts
        model = srv.spec.served_model_name
        prompts: dict[Any, list[int]] = {}
        halt = threading.Event()
        progress = Progress(len(self.want), f"greedy {self.name}/{arm}", done=len(self.want) - len(todo))

        def one(w: tuple[str, Any]) -> None:
            if halt.is_set() or lifecycle.stopping():
                return
            srv.assert_alive()
            index = self.index_of(*w)
            if index not in prompts:  # two threads may both ask for one prompt: the same ids either way
                prompts[index] = prompt_ids(srv.endpoint, model, self.messages[index], self.chat_template_kwargs)
            rec = greedy_one(srv.endpoint, model, prompts[index], max_tokens=self.max_tokens, index=index)
            rec.update({"run": w[0], "slot": w[1], "key": self.key, "prompt_ids": prompts[index],
                        "messages_sha256": self._messages_sha[index]})
            journal.append(rec)
            self.last[w] = rec
            if is_final(rec):
                self.done.setdefault(w, rec)

        def pooled(runs: list[tuple[str, Any]], workers: int) -> None:
            pool = ThreadPoolExecutor(max_workers=max(1, workers))
            try:
                # stepped here, in the calling thread, so Progress needs no lock
                for fut in as_completed([pool.submit(one, w) for w in runs]):
                    fut.result()
                    progress.step()
            except Exception:
                halt.set()  # queued runs are not sent; those in flight end and are journaled
                pool.shutdown(wait=True, cancel_futures=True)
                raise
            except BaseException:
                lifecycle.request_stop("the greedy runs were interrupted")
                pool.shutdown(wait=False, cancel_futures=True)
                raise
            pool.shutdown(wait=True)

        pooled([w for w in todo if w[0] == GREEDY], concurrency)
        # The determinism repeats one at a time, after every other run has ended: each is then the only request
        # in the server's batch, so a difference between them is the server's own run-to-run nondeterminism,
        # never a different batch around the same request (a server whose numbers depend on the batch, as
        # vLLM's do by default, would fail determinism-v1 on batching alone).
        pooled([w for w in todo if w[0] == DETERMINISM], 1)
        lifecycle.check_stop()
        srv.assert_alive()
        return counts

    def records(self) -> tuple[list[GreedyRecord], dict]:
        """(the greedy run of every item in index order, the determinism repeats as the greedy artifact keeps them).

        Raises ``GreedyError`` naming the runs without an answer: the answers phase has not finished them.
        """
        if self.todo:
            raise GreedyError(f"{self.name}: greedy runs without an answer in {self.journal}: {self.todo[:20]}; "
                              "rerun the arm's answers phase to ask only those")
        runs = [self.done[w] for w in self.want if w[0] == GREEDY]
        repeats = [self.done[w] for w in self.want if w[0] == DETERMINISM]
        # A refused repeat gets a pseudo-hash of its own (its slot in it): two
        # repeats refused alike are two failures, never two outputs that matched.
        hashes = [r["output_sha256"] or f"error:{slot}:{r['error']}" for slot, r in enumerate(repeats)]
        return runs, {"index": self.det_index, "hashes": hashes, "records": repeats}

    def summary(self) -> dict:
        """What the answers phase's record says of this plan."""
        return {"journal": str(self.journal), "key": self.key, "items": sum(1 for w in self.want if w[0] == GREEDY),
                "determinism_repeats": sum(1 for w in self.want if w[0] == DETERMINISM), "open": len(self.todo)}
