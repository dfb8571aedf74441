"""The speed bracket's workload: cells, prompts identical in every start, request bodies, seeds.

Workload
--------
A *cell* is (name, prompt kind, input length, concurrency, decide). Per start
the order is: one warm-up request (not measured), then for repeat r in
0..R-1, for each cell, for wave w in 0..W-1: ``concurrency`` streams started
together, each ``/v1/completions`` with ``stream``, ``max_tokens = min_tokens
= output_len``, ``ignore_eos``, ``temperature=1``, ``top_p=1``, ``seed =
base_seed + 1000 * (r * W + w) + i`` (identical in every start), a prompt
that is identical in every start (prompt kinds: ``short`` -- one fixed
sentence; ``long`` -- varied filler text, its last ``input_len`` tokens;
``random`` -- ``input_len`` token ids drawn at random (seeded by cell, r, w,
i) from the filler's vocabulary, in the spirit of ``vllm bench serve
--dataset-name random`` (whose ids span the whole vocabulary);
``repetitive`` -- a short pattern repeated up to ``input_len`` tokens, the workload where n-gram
speculation has something to draft), and a fresh uuid4 ``cache_salt``.
The server's ``/metrics`` is scraped right before a repeat's first wave of a
cell and, after its last wave, once the server counts the repeat's requests as
finished (a client sees the last chunk before the server books the request);
the waves of a repeat follow each other with no scrape between them, so no
stream starts after an idle gap of the bracket's own making.
"""

from __future__ import annotations

import random
import uuid
from typing import Mapping, Sequence

from pairaudit.core.settings import SpeedCell
from pairaudit.serving.client import Endpoint

PROMPT_KINDS = ("short", "long", "random", "repetitive")


# ------------------------------------------------------------------ prompts

SHORT_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
REPETITIVE_UNIT = ("The quick brown fox jumps over the lazy dog. 1, 2, 3, 4, 5, 6, 7, 8, 9, 10. "
                   "Again: ")
_WORDS = {
    "adj": ["amber", "brisk", "coastal", "dusty", "early", "faded", "granite", "hollow", "inland", "jagged",
            "late", "misty", "narrow", "open", "pale", "quiet", "rural", "steep", "tidal", "upper"],
    "noun": ["bridge", "canal", "depot", "engine", "ferry", "granary", "harbour", "kiln", "lock", "mill",
             "orchard", "pier", "quarry", "reservoir", "station", "tannery", "viaduct", "warehouse", "yard"],
    "place": ["Aldwick", "Brant", "Colby", "Dunmore", "Elstow", "Farley", "Garth", "Hexley", "Ilford",
              "Kelso", "Lindow", "Marden", "Norley", "Oxted", "Penrith", "Rydal", "Selby", "Thirsk"],
}


def long_text(n_sentences: int, seed: int = 0) -> str:
    """Varied, non-repeating filler for long prompts (numbers differ sentence to sentence)."""
    rng = random.Random(seed)
    out = []
    for k in range(n_sentences):
        out.append(f"Record {k + 1}: the {rng.choice(_WORDS['adj'])} {rng.choice(_WORDS['noun'])} at "
                   f"{rng.choice(_WORDS['place'])} logged {rng.randint(10, 9999)} units on day "
                   f"{rng.randint(1, 365)}, {rng.choice(['up', 'down', 'flat'])} from the week before.")
    return " ".join(out) + "\nSummarise the records above."


def _tokenize(ep: Endpoint, model: str, text: str) -> list[int]:
    res = ep.post_json("/tokenize", {"model": model, "prompt": text, "add_special_tokens": False}, timeout_s=60)
    if res["error"] is not None or not isinstance(res["body"], dict) or "tokens" not in res["body"]:
        raise RuntimeError(f"/tokenize failed while building speed prompts: {res['error'] or res['body']!r}")
    return list(res["body"]["tokens"])


def build_prompts(ep: Endpoint, model: str, cells: Sequence[SpeedCell], repeats: int,
                  waves: int | Mapping[str, int], base_seed: int) -> dict:
    """cell -> (r, w, i) -> token ids: built once, sent unchanged to every start (``waves``: per cell, or one for all).

    Token-id prompts make every start see exactly the same input whatever its
    chat template or tokenizer settings. ``random`` draws ids from the
    tokenized filler text (real, non-special tokens), seeded per stream.
    """
    long_ids = _tokenize(ep, model, long_text(40 + max(c.input_len for c in cells) // 8, seed=base_seed))
    need = max(c.input_len for c in cells)
    while len(long_ids) < need:
        long_ids = long_ids + long_ids  # only reached for very long cells; still valid input
    short_ids = _tokenize(ep, model, SHORT_PROMPT)
    rep_unit = _tokenize(ep, model, REPETITIVE_UNIT)
    vocab = sorted(set(long_ids))
    out: dict = {}
    for c in cells:
        n = c.input_len
        per: dict = {}
        n_waves = waves if isinstance(waves, int) else waves[c.name]
        for r in range(repeats):
            for w in range(n_waves):
                for i in range(c.concurrency):
                    if c.prompt == "short":
                        ids = short_ids[:n]
                    elif c.prompt == "long":
                        ids = long_ids[-n:]  # keep the closing instruction
                    elif c.prompt == "repetitive":
                        ids = (rep_unit * (n // len(rep_unit) + 1))[:n]
                    else:
                        rng = random.Random(f"{base_seed}:{c.name}:{r}:{w}:{i}")
                        ids = [rng.choice(vocab) for _ in range(n)]
                    per[(r, w, i)] = ids
        out[c.name] = per
    return out


def request_body(model: str, prompt_ids: list[int], *, output_len: int, seed: int) -> dict:
    return {"model": model, "prompt": prompt_ids, "max_tokens": output_len, "min_tokens": output_len,
            "ignore_eos": True, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "seed": seed,
            "cache_salt": uuid.uuid4().hex}


def stream_seed(base_seed: int, r: int, w: int, waves: int, i: int) -> int:
    return base_seed + 1000 * (r * waves + w) + i
