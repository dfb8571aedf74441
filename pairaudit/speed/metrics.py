"""The speed bracket's metrics: server counters pooled per start, cell and repeat; client timings.

Metrics (server, pooled per start, cell and repeat over its W waves)
--------------------------------------------------------------------
From the counter deltas of the waves, summed:

- ``requests`` = Δ ``vllm:request_success_total``
- ``generation_tokens`` = Δ ``vllm:generation_tokens_total``
- ``accepted`` = Δ ``vllm:spec_decode_num_accepted_tokens_total``
- ``drafts`` = Δ ``vllm:spec_decode_num_drafts_total``,
  ``draft_tokens`` = Δ ``vllm:spec_decode_num_draft_tokens_total``
- ``decode_s`` = Δ ``vllm:request_decode_time_seconds_sum`` (per request,
  first token -> finish; summed over requests, so at concurrency c it is
  about c x the wall time: every rate below is a per-stream rate)
- ``rounds`` = generation_tokens - accepted - requests: decode rounds. The
  first token of each request comes from its prefill; every later round
  emits 1 token plus its accepted drafts. For a non-speculative server
  (accepted = 0) this is the number of decode steps per request, summed;
  under speculation it counts rounds that drafted nothing as well (the
  refserver's ``drafts`` counts only rounds with at least one draft, as
  vLLM's does), which is why rounds are not read from ``drafts``.
- ``pooled_rate_tps`` = (rounds + accepted) / decode_s  [primary, higher better]
- ``accepted_per_round`` = accepted / rounds              [guard, higher better]
- ``ms_per_round`` = 1000 * decode_s / rounds             [reported, lower better]

Client metrics (``vllm bench serve`` definitions, ``client.stream_completion``):
TTFT = first chunk with choices; ITL = gaps between chunks (per chunk, so
several tokens per gap under speculation); E2EL = last chunk - start; TPOT =
(E2EL - TTFT) / (output_tokens - 1), output_tokens from usage; output
throughput = sum output tokens / wall duration of the waves.

- ``decode_tps`` = sum(output_tokens - 1) / sum(E2EL - TTFT)  [guard, higher better]
- ``ttft_s`` = mean TTFT                                       [reported, lower better]

Which metric plays which role is config (``speed.primary/guards/reported``);
the defaults above are those of a GPU speed audit.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

METRICS = ("pooled_rate_tps", "accepted_per_round", "ms_per_round", "decode_tps", "ttft_s")
LOWER_IS_BETTER = frozenset({"ms_per_round", "ttft_s"})


# ------------------------------------------------------------------ metrics

def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else None


def _summary_ms(values: Sequence[float]) -> dict:
    v = [1000.0 * x for x in values if x is not None]
    if not v:
        return {"mean": None, "median": None, "std": None, "p90": None, "p99": None, "n": 0}
    a = np.asarray(v, dtype=float)
    return {"mean": float(a.mean()), "median": float(np.median(a)), "std": float(a.std()),
            "p90": _pct(v, 90), "p99": _pct(v, 99), "n": len(v)}


def bench_serve_table(streams: Sequence[Mapping[str, Any]], duration_s: float) -> dict:
    """``vllm bench serve``'s summary over a set of streams and their wall duration.

    Like vLLM: only successful requests count; TPOT over requests with more
    than one output token; ITL over every chunk gap of every request.
    """
    ok = [s for s in streams if s.get("error") is None and s.get("output_tokens")]
    out_tok = sum(int(s["output_tokens"]) for s in ok)
    return {
        "completed": len(ok), "failed": len(streams) - len(ok), "duration_s": duration_s,
        "total_output_tokens": out_tok,
        "request_throughput": len(ok) / duration_s if duration_s > 0 else None,
        "output_throughput": out_tok / duration_s if duration_s > 0 else None,
        "ttft_ms": _summary_ms([s["ttft_s"] for s in ok]),
        "tpot_ms": _summary_ms([s["tpot_s"] for s in ok if s.get("tpot_s") is not None]),
        "itl_ms": _summary_ms([x for s in ok for x in s.get("itl_s") or []]),
        "e2el_ms": _summary_ms([s["e2el_s"] for s in ok]),
    }


COUNTERS = {"requests": "vllm:request_success_total", "generation_tokens": "vllm:generation_tokens_total",
      "accepted": "vllm:spec_decode_num_accepted_tokens_total", "drafts": "vllm:spec_decode_num_drafts_total",
      "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
      "decode_s": "vllm:request_decode_time_seconds_sum"}


def pool_repeat(waves: Sequence[Mapping[str, Any]]) -> dict:
    """Pool one repeat's waves (each ``{"delta": {metric: value}, "streams": [...]}``) into its metrics.

    Counters are summed over the waves before any ratio (pooled, as a speed audit pools its waves),
    so a short wave does not weigh as much as a long one.
    """
    tot = {k: sum(float(w["delta"].get(name, 0.0)) for w in waves) for k, name in COUNTERS.items()}
    rounds = tot["generation_tokens"] - tot["accepted"] - tot["requests"]
    streams = [s for w in waves for s in w["streams"]]
    ok = [s for s in streams if s.get("error") is None and s.get("ttft_s") is not None and s.get("e2el_s")]
    dec_tok = sum(int(s["output_tokens"] or 0) - 1 for s in ok)
    dec_s = sum(s["e2el_s"] - s["ttft_s"] for s in ok)
    errors = [s["error"] for s in streams if s.get("error") is not None]

    def ratio(a, b, scale=1.0):
        return scale * a / b if b > 0 else None

    return {**tot, "rounds": rounds, "waves": len(waves), "streams": len(streams), "errors": errors,
            "pooled_rate_tps": ratio(rounds + tot["accepted"], tot["decode_s"]),
            "accepted_per_round": ratio(tot["accepted"], rounds),
            "ms_per_round": ratio(tot["decode_s"], rounds, 1000.0),
            "decode_tps": ratio(dec_tok, dec_s),
            "ttft_s": float(np.mean([s["ttft_s"] for s in ok])) if ok else None}


# ----------------------------------------------------------------- decision

def start_roles(n_starts: int) -> list[tuple[str, str, str]]:
    """(start, role, arm) of an alternating bracket: s1 control, s2 candidate, s3 control, s4 candidate, ..."""
    out = []
    for k in range(n_starts):
        arm = "control" if k % 2 == 0 else "candidate"
        role = ("control_before" if k == 0 else "control_after" if k == 2 else f"control_{k // 2 + 1}"
                if arm == "control" else "candidate" if k == 1 else f"candidate_{k // 2 + 1}")
        out.append((f"s{k + 1}", role, arm))
    return out


# The one bracket of three starts win2-v1 and win2-v2 are registered for.
START_ROLES = tuple(start_roles(3))


def series_for(cell_results: Mapping[str, Mapping[str, Any]], metrics: Iterable[str],
               starts: Sequence[str] | None = None) -> dict:
    """metric -> per repeat [s1, s2, s3, ...] from ``{start: {"pooled": [per repeat]}}``."""
    starts = list(starts) if starts is not None else [s for s, _, _ in START_ROLES]
    n = len(cell_results[starts[0]]["pooled"])
    return {m: [[cell_results[s]["pooled"][r][m] for s in starts] for r in range(n)] for m in metrics}


def spread_stats(values: Sequence[float]) -> dict:
    v = [float(x) for x in values if x is not None and math.isfinite(x)]
    if len(v) < 2:
        return {"n": len(v), "range_pct": None, "cv_pct": None, "mean": float(np.mean(v)) if v else None}
    a = np.asarray(v)
    return {"n": len(v), "mean": float(a.mean()), "range_pct": float(100.0 * (a.max() - a.min()) / abs(a.mean())),
            "cv_pct": float(100.0 * a.std(ddof=1) / abs(a.mean()))}


def finite_json(obj: Any) -> Any:
    """JSON without NaN/inf (a 0/0 ratio is 'no value', not a number)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj
