"""What the server phases will ask, decided before any server starts.

Three small artifacts, each computed from the config alone, stand between the
config and the phases so that Snakemake reruns exactly what a change touches:

- ``specs/<arm>.json``: the arm's resolved server spec and its identity hash;
  it changes only when the arm does (the speed bracket, the boundary gate and
  the diagnostics depend on it);
- ``requests/<dataset>/<arm>.json``: the exact request body of every item of
  one dataset on one arm; it changes only when that dataset, the sampling
  settings or the arm do (the dataset's answers are assembled from it);
- ``boundary/plan.json``: the boundary settings both arms' cases are built
  from.

The phases read the answers' outputs of other datasets as ``ancient``
(answering one dataset must not rerun another's chain), so these plans carry
the dependency instead: a job reruns when its plan changes, and only then.
"""

from __future__ import annotations

from pairaudit.core import artifacts
from pairaudit.core.contracts import REQUESTS_SCHEMA


def read_requests(path: str) -> dict:
    return artifacts.check_schema(artifacts.read_json(path), REQUESTS_SCHEMA, path)


def bodies(requests: dict) -> dict[int, dict]:
    return {it["index"]: it["body"] for it in requests["items"]}


SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "max_tokens")


def item_salt(audit: str, dataset: str, index: int) -> str:
    return artifacts.sha256_text(f"pairaudit-salt/{audit}/{dataset}/{index}")[:32]


def request_body(item: dict, sampling: dict, *, model: str, audit: str, dataset: str) -> dict:
    """The chat request for one item; identical in both arms but for ``model``."""
    return {
        "model": model,
        "messages": item["messages"],
        "temperature": sampling["temperature"],
        "top_p": sampling["top_p"],
        "top_k": sampling["top_k"],
        "min_p": sampling["min_p"],
        "seed": sampling["base_seed"] + item["index"],
        "max_tokens": sampling["max_tokens"],
        "min_tokens": 0,
        "n": 1,
        "stop": [],
        "ignore_eos": False,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "repetition_penalty": 1.0,
        "skip_special_tokens": True,
        "chat_template_kwargs": dict(sampling.get("chat_template_kwargs") or {}),
        "cache_salt": item_salt(audit, dataset, item["index"]),
        "stream": False,
    }


def body_sha256(body: dict) -> str:
    return artifacts.sha256_json({k: v for k, v in body.items() if k != "model"})
