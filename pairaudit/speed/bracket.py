"""Speed stage: the OFF/ON/OFF bracket decided by win2-v2 (default) or win2-v1.

``speed.rule`` selects the registered rule: win2-v2 (gates.win2_v2, the
default; docs/speed.md) decides over all deciding cells at once against an
interval that keeps the start-to-start noise, and says INCONCLUSIVE when the
window is too noisy to decide at the bar; win2-v1 (gates.win2_v1, kept
unchanged and selectable, reported as a deviation) pairs by repeat per cell.

One job runs three fresh servers on the same host, one after the other:
s1 = control, s2 = candidate, s3 = control, each from its arm's spec and
checked against its launch receipt. Every start runs the same cells with the
same seeds; every stream gets a fresh ``cache_salt``. Repeat r of the
decision pairs s2's repeat r with the mean of s1's and s3's repeat r.

The prompts and request bodies are :mod:`pairaudit.speed.workload`, the pooled
metrics :mod:`pairaudit.speed.metrics`, the clock facts :mod:`pairaudit.speed.clock`,
the verdict over win2 :mod:`pairaudit.speed.decision`, the control archive
:mod:`pairaudit.speed.archive`; this module resolves the config, runs the
bracket (its failure path too); :mod:`pairaudit.speed.stage` writes the artifacts.

Artifacts
---------
``results/<audit>/speed/decision.json`` (``schema: pairaudit.speed_decision/v1``)::

    schema, audit,
    gate:          the speed verdict as a rule result: {"rule": "win2-v2"|
                   "win2-v1", "verdict": WIN|NO_WIN|LOSS|INCONCLUSIVE,
                   "reasons": [...], "params", "deviations" (the rule's
                   {param: {registered, used}}), "stage_deviations": [{gate,
                   what, detail}] (an accepted unverifiable clock, a
                   non-default rule, rule parameters off their registered
                   values), "informational": bool, "decision_cells": [...],
                   "cells": {cell: verdict}, "clock_check": "OK"|"DIFFERENT"|
                   "UNVERIFIABLE"}; under win2-v2 also noise {rep_sd_pct,
                   start_sd_pct, start_sd_used_pct, s1_s3_diff_pct, guards},
                   rates {measured, assumed: false_win, false_loss, power,
                   ...}, needed {repeats_needed, brackets_needed,
                   half_width_pct}, pooled_gain_pct, half_width_pct,
                   lower_bound_pct, loss_tests, repeats, reported.
                   win2-v2's verdict is its own (gates.win2_v2).
                   win2-v1's verdict over the decision cells: LOSS if any is LOSS;
                   else INCONCLUSIVE if any is INCONCLUSIVE; else WIN if
                   every one WINs; else NO_WIN. ``informational`` (config
                   ``speed.informational``) tells promotion-v1 that only a
                   LOSS may gate (it REJECTs); WIN/NO_WIN/INCONCLUSIVE are
                   then recorded, not decisive.
    win2:          win2-v2: {cell: {rule, decides, verdict, primary
                   {point_gain_pct, s1_s3_diff_pct, within_sd_pct}, guards
                   {metric: {point_gain_pct, guard_verdict}}, losses,
                   archive_spread_pct}} (a deciding cell's verdict is LOSS,
                   ABOVE_BAR or NOT_ABOVE_BAR: the gate decides over all).
                   win2-v1: {cell: full win2-v1 result (rules.win2_v1): primary /
                   guards / reported per metric with control (list per
                   repeat), candidate, control_before, control_after, diff,
                   point_gain_pct, t_interval {mean, lo, hi, level},
                   control_spread, control_spread_pct,
                   max_control_spread_pct, win_pct, verdict; guards also
                   repeats_worse_than_spread, guard_verdict), plus
                   guard_loss_needed, clock_caps, archive_spread_pct. A cell
                   whose series has a null value gets only {rule, verdict:
                   "INCONCLUSIVE", reasons, params, deviations}}
    bar:           {win_pct, primary, guards, reported, lower_is_better}
    starts:        [{start: "s1"|"s2"|"s3", role: "control_before"|
                   "candidate"|"control_after", arm: "control"|"candidate",
                   host (socket.gethostname()), slurm_job_id,
                   slurmd_nodename (null when unset), clock: clock facts
                   (speedclock.clock_facts; the GPUs of the arm's
                   CUDA_VISIBLE_DEVICES) taken before the server starts, clock_after: the
                   same after its last wave, before it stops, started_at, stopped_at,
                   warmup: {error, ttft_s, e2el_s}, server: {pid, url,
                   ready_s, identity_check, stop}}]
    hosts:         sorted distinct hosts of the starts (one, by construction)
    deviations:    gate.stage_deviations (for decision.json)
    clock_check:   {cap_keys, caps: [cap facts per start], caps_after,
                   mismatch: [keys that differ], expected, off_expected:
                   [keys], within_start: [{start, changed, before, after}],
                   slowdowns: [{start, gpu, uuid, reason, us, source,
                   detail}], power_cap: [{start, gpu, uuid, power_limit_w,
                   sw_power_cap_us, sync_boost_us, seen_active}], gpu_ids:
                   {start: [uuid]}, notes, unverifiable: [{start, gaps}],
                   verdict: "OK"|"DIFFERENT"|"UNVERIFIABLE"}
                   (pairaudit.speed.clock, pairaudit.speed.gpu)
    cells:         [cell config as run (name, prompt, input_len,
                   concurrency, decide, prompt_tokens)]
    pooled:        {cell: {start: [per repeat: {requests,
                   generation_tokens, accepted, drafts, draft_tokens,
                   decode_s, rounds, pooled_rate_tps, accepted_per_round,
                   ms_per_round, decode_tps, ttft_s, waves, streams,
                   errors}]}}   (a ratio with a zero denominator is null)
    series:        {cell: {metric: [per repeat [s1, s2, s3]]}}   (what win2-v1 got)
    bench_serve:   {cell: {start: {completed, failed, duration_s,
                   total_output_tokens, request_throughput,
                   output_throughput, and for ttft_ms, tpot_ms, itl_ms,
                   e2el_ms: {mean, median, std, p90, p99, n}}}}
    spread:        {cell: {metric (the primary), win_pct, window_pct:
                   per repeat 100 * |s1 - s3| / mean(s1, s3), window_max_pct,
                   archive_pct / archive_n / archive_cv_pct: spread of the
                   primary over the archived control starts with the same
                   cell and config hash from *before* this job
                   (100 * (max - min) / mean; null with < 2 starts),
                   archive_with_window_pct / archive_with_window_n: the same
                   including this job's two control starts, config_hash}}
    archive:       {path, appended: number of lines this job appended}
    streams:       path of streams.jsonl
    params:        the speed config used (defaults filled in); provenance

A bracket that was not measured has instead ``not_run`` (why) and an
INCONCLUSIVE gate: a failed preflight stops it before any start; a server
that fails under it (a stream's 5xx or refused connection, a dead process, a
start that never became healthy, outputs shorter than forced, e.g. a silent
max_tokens clamp) adds ``failure`` (a failures.FailureRecord with stage
"speed", the wave's bodies as sent and the server's log tail; a candidate's
5xx or death is re-run once on a fresh start, stored as its
``confirmation``) and ``starts`` up to the failed one. The promotion reads
that failure into the servers gate; streams.jsonl keeps what was measured.

``results/<audit>/speed/streams.jsonl``: header ``{schema:
pairaudit.speed_streams/v1, provenance}`` then one line per request: start,
arm, cell, repeat, wave, stream, seed, cache_salt, prompt_tokens, status,
started_at (when this request was sent), error, finish_reason, output_tokens,
ttft_s, tpot_s, e2el_s, itl_s (list), chunks, text (the generated text), wave_started_at; warm-up requests
have ``cell: "warmup"``.
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from pairaudit.core import defaults
from pairaudit.core.artifacts import utc_now
from pairaudit.core.progress import Progress
from pairaudit.core.settings import SpeedSettings
from pairaudit.gates import server_failure
from pairaudit.gates import SEQUENTIAL_RULES
from pairaudit.serving import failures
from pairaudit.serving.client import Endpoint, clamping, metrics_delta
from pairaudit.speed.clock import expected_cap_errors, host_cpu_share, host_cpu_times
from pairaudit.speed.decision import RULES
from pairaudit.speed.metrics import (
    COUNTERS,
    METRICS,
    bench_serve_table,
    pool_repeat,
)
from pairaudit.speed.workload import PROMPT_KINDS, request_body, stream_seed

log = logging.getLogger("pairaudit")


class BracketFailure(RuntimeError):
    """A start of the bracket could not be measured: the server failed a stream or broke the workload's terms."""

    def __init__(self, msg: str, *, what: str, kind: str, status: int | None, error: str | None,
                 error_body: Any = None, requests: Sequence[dict] = ()):
        super().__init__(msg)
        self.what, self.kind, self.status, self.error = what, kind, status, error
        self.error_body, self.requests = error_body, list(requests)

# The names the rules and tests read these contracts by.

# A GPU audit's defaults (the schema's). The embedded config/config.yaml
# shrinks them so one bracket fits in minutes on a 2-core CPU.
DEFAULTS: dict[str, Any] = defaults.section("speed")
CELL_DEFAULTS: dict[str, Any] = defaults.items("speed", "cells")  # input_len, concurrency, decide


class SpeedConfigError(ValueError):
    pass


def resolve_config(cfg: Mapping[str, Any] | None) -> dict:
    """The ``speed:`` section with defaults filled in, or a SpeedConfigError naming the key."""
    cfg = dict(cfg or {})
    unknown = set(cfg) - set(DEFAULTS)
    if unknown:
        raise SpeedConfigError(f"speed: unknown key(s) {sorted(unknown)} (allowed: {', '.join(DEFAULTS)})")
    out = {**DEFAULTS, **cfg}

    def pos_int(key):
        v = out[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SpeedConfigError(f"speed.{key}: {v!r} is not a positive integer")

    for k in ("repeats", "waves", "output_len"):
        pos_int(k)
    if out["repeats"] < 2:
        raise SpeedConfigError(f"speed.repeats: {out['repeats']} < 2 gives no paired-t interval (need >= 2)")
    if out["output_len"] < 2:
        raise SpeedConfigError("speed.output_len: must be >= 2 (TPOT and decode rounds need a second token)")
    if isinstance(out["base_seed"], bool) or not isinstance(out["base_seed"], int):
        raise SpeedConfigError(f"speed.base_seed: {out['base_seed']!r} is not an integer")
    for k in ("enabled", "informational", "accept_unverifiable_clock"):
        if not isinstance(out[k], bool):
            raise SpeedConfigError(f"speed.{k}: {out[k]!r} is not one of true, false")
    if isinstance(out["win_pct"], bool) or not isinstance(out["win_pct"], (int, float)) or out["win_pct"] < 0:
        raise SpeedConfigError(f"speed.win_pct: {out['win_pct']!r} is not a non-negative number")
    if out["rule"] not in RULES:
        raise SpeedConfigError(f"speed.rule: {out['rule']!r} is not one of {', '.join(RULES)}")
    rs = out["repeat_s"]
    if rs is not None and (isinstance(rs, bool) or not isinstance(rs, (int, float)) or rs <= 0):
        raise SpeedConfigError(f"speed.repeat_s: {rs!r} is not a positive number of seconds or null")
    ms = out["max_starts"]
    if isinstance(ms, bool) or not isinstance(ms, int) or ms < 3 or ms % 2 == 0:
        raise SpeedConfigError(f"speed.max_starts: {ms!r} is not an odd integer >= 3 (control first and last, "
                               "alternating with the candidate)")
    age = out["evidence_max_age_h"]
    if isinstance(age, bool) or not isinstance(age, (int, float)) or age <= 0:
        raise SpeedConfigError(f"speed.evidence_max_age_h: {age!r} is not a positive number of hours")
    snp = out["start_noise_pct"]
    if isinstance(snp, bool) or not isinstance(snp, (int, float)) or not 0 <= snp < 100:
        raise SpeedConfigError(f"speed.start_noise_pct: {snp!r} is not a number in [0, 100)")
    if out["primary"] not in METRICS:
        raise SpeedConfigError(f"speed.primary: {out['primary']!r} is not one of {', '.join(METRICS)}")
    for k in ("guards", "reported"):
        if not isinstance(out[k], list) or any(m not in METRICS for m in out[k]):
            raise SpeedConfigError(f"speed.{k}: {out[k]!r} must be a list of {', '.join(METRICS)}")
    roles = [out["primary"], *out["guards"], *out["reported"]]
    if len(set(roles)) != len(roles):
        raise SpeedConfigError(f"speed: a metric has more than one role among primary/guards/reported: {roles}")
    bad_cap = expected_cap_errors(out["expected_clock_cap"])
    if bad_cap:
        raise SpeedConfigError(f"speed.expected_clock_cap: {'; '.join(bad_cap)}")
    cells = out["cells"]
    if not isinstance(cells, list) or not cells:
        raise SpeedConfigError("speed.cells: must be a non-empty list")
    names, resolved = set(), []
    for i, c in enumerate(cells):
        w = f"speed.cells[{i}]"
        if not isinstance(c, dict):
            raise SpeedConfigError(f"{w}: must be a mapping")
        extra = set(c) - {"name", "prompt", "input_len", "concurrency", "decide"}
        if extra:
            raise SpeedConfigError(f"{w}: unknown key(s) {sorted(extra)} "
                                   "(allowed: name, prompt, input_len, concurrency, decide)")
        name = c.get("name")
        if not isinstance(name, str) or not name or name in names or name == "warmup":
            raise SpeedConfigError(f"{w}.name: {name!r} must be a unique non-empty string (not 'warmup')")
        names.add(name)
        if c.get("prompt") not in PROMPT_KINDS:
            raise SpeedConfigError(f"{w}.prompt: {c.get('prompt')!r} is not one of {', '.join(PROMPT_KINDS)}")
        cc = {"name": name, "prompt": c["prompt"], **{k: c.get(k, v) for k, v in CELL_DEFAULTS.items()}}
        for k in ("input_len", "concurrency"):
            if isinstance(cc[k], bool) or not isinstance(cc[k], int) or cc[k] < 1:
                raise SpeedConfigError(f"{w}.{k}: {cc[k]!r} is not a positive integer")
        if not isinstance(cc["decide"], bool):
            raise SpeedConfigError(f"{w}.decide: {cc['decide']!r} is not one of true, false")
        resolved.append(cc)
    if not any(c["decide"] for c in resolved):
        raise SpeedConfigError("speed.cells: no cell has decide: true; the verdict needs a decision cell")
    out["cells"] = resolved
    if out["rule"] not in SEQUENTIAL_RULES:
        out["max_starts"] = 3  # win2-v1 and win2-v2 are registered for one bracket of three starts
    return out


def resolve(cfg: Mapping[str, Any] | None) -> SpeedSettings:
    """The ``speed:`` section resolved into its record (``resolve_config``'s checks), or a SpeedConfigError."""
    return SpeedSettings.from_json(resolve_config(cfg))


# ------------------------------------------------------------------- window
# A host booked for a window (config window_min) must be free when it ends. The workflow's load plans the
# audit and hands its jobs the moment the bracket must have finished (pairaudit.timeplan.plan.speed_deadline:
# the window's end less the worst case of what may still follow the bracket). The bracket starts no start it
# could not finish by then, judged by the slowest start it has measured so far.

WINDOW_DEADLINE_ENV = "PAIRAUDIT_SPEED_DEADLINE"   # epoch seconds; unset: no window
WINDOW = "window"                                  # the reason of a bracket stopped by it


def window_deadline() -> float | None:
    """The bracket's deadline the workflow set for this job (epoch seconds), or None without a window."""
    raw = os.environ.get(WINDOW_DEADLINE_ENV)
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise SpeedConfigError(f"${WINDOW_DEADLINE_ENV}: {raw!r} is not a time in epoch seconds") from None


@dataclass(frozen=True)
class WindowStop:
    """A bracket the window stopped: the starts it had, those it would have needed, and why it stopped."""
    deadline: float                  # epoch seconds by which its last start had to end
    starts_had: int
    starts_needed: int
    start_cost_s: float | None       # the slowest start measured before it stopped (None: none measured)
    at: float                        # when it stopped (epoch seconds)
    unclosed: str | None = None      # a candidate start measured but closed by no control start (left out)

    def to_json(self) -> dict[str, Any]:
        return {"reason": WINDOW, "deadline": _iso(self.deadline), "at": _iso(self.at),
                "starts_had": self.starts_had, "starts_needed": self.starts_needed,
                "start_cost_s": self.start_cost_s, "unclosed": self.unclosed}

    def reason(self) -> str:
        cost = ("" if self.start_cost_s is None
                else f" (a start took up to {self.start_cost_s:.0f} s here)")
        return (f"window: the bracket stopped after {self.starts_had} of the {self.starts_needed} starts it needed: "
                f"another start{cost} would end after the window's deadline {_iso(self.deadline)}; its starts "
                "are kept, measured as they were"
                + ("" if self.unclosed is None else f" (candidate start {self.unclosed}, which no control start "
                   "closed, only in the streams: the comparison stops at the last control start)"))


def _iso(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat(timespec="seconds")


def fits_window(deadline: float | None, start_cost_s: float | None, now: float, *, starts: int = 1) -> bool:
    """Whether ``starts`` starts begun ``now`` end by ``deadline``, each at the slowest start cost measured so far.

    A candidate start is worth nothing without the control start that closes its window, so the stage asks
    for both before it begins one (``starts=2``)."""
    if deadline is None:
        return True
    return now + starts * (start_cost_s or 0.0) <= deadline


def window_outcome(gate: Mapping[str, Any] | None, stop: WindowStop, *, rule: str) -> dict[str, Any]:
    """The speed gate of a bracket the window stopped: INCONCLUSIVE for the window, whatever the rule said at
    its last look (kept as ``stage_verdict``, with every number of that look); ``stopped_by`` and ``window``
    say so for the decision and the report."""
    out: dict[str, Any] = dict(gate or {"rule": rule, "reasons": []})
    if gate is not None:
        out["stage_verdict"] = gate.get("verdict")
    out["verdict"] = "INCONCLUSIVE"
    out["reasons"] = [stop.reason(), *out.get("reasons", [])]
    out["stopped_by"] = WINDOW
    out["window"] = stop.to_json()
    return out


# ------------------------------------------------------------------ running

def _scrape(ep: Endpoint) -> dict[str, float]:
    res, parsed = ep.scrape_metrics(timeout_s=60)
    if parsed is None:
        why = res["error"] or "not Prometheus text"
        raise BracketFailure(f"/metrics scrape failed: {why}", what="GET /metrics",
                             kind=failures.classify(res.get("status")) if res["error"] else server_failure.FAILED_CHECK,
                             status=res.get("status"), error=why, error_body=res.get("body"))
    return parsed


def settled_scrape(ep: Endpoint, finished: float, *, timeout_s: float = 60.0) -> dict[str, float]:
    """/metrics once ``finished`` requests are counted as finished.

    A client sees a stream's last chunk before the server books the request
    (success counter, decode-time histogram): a scrape taken at once would
    leave that request's decode seconds to the next wave. Measured here: the
    warm-up's decode time landed in the first wave.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        m = _scrape(ep)
        if m.get(COUNTERS["requests"], 0.0) >= finished or time.monotonic() > deadline:
            if m.get(COUNTERS["requests"], 0.0) < finished:
                raise RuntimeError(f"/metrics still counts {m.get(COUNTERS['requests'], 0.0):g} finished requests "
                                   f"after {timeout_s:g} s, expected {finished:g}")
            return m
        time.sleep(0.02)


def send_together(ep: Endpoint, bodies: Sequence[dict], *, timeout_s: float) -> list[dict]:
    """Every body as a stream, all released at once; the results in the bodies' order."""
    results: list[dict | None] = [None] * len(bodies)
    gate = threading.Barrier(len(bodies))

    def one(k: int) -> None:
        gate.wait()
        results[k] = ep.stream_completion("/v1/completions", bodies[k], timeout_s=timeout_s)

    threads = [threading.Thread(target=one, args=(k,), daemon=True) for k in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results  # type: ignore[return-value]


def failed_streams(streams: Sequence[dict]) -> list[tuple[int, dict]]:
    """(index, stream) of every failed stream, the one the server answered with an HTTP error first.

    That one carries the engine's own words; a stream cut off by the same death
    is only its echo, and which of them finishes first is a race.
    """
    bad = [(i, s) for i, s in enumerate(streams) if s.get("error") is not None]
    return sorted(bad, key=lambda x: (not (x[1].get("status") or 0) >= 400, x[0]))


def run_wave(ep: Endpoint, bodies: Sequence[dict], *, timeout_s: float, scrape: bool = True) -> dict:
    """Start every stream of the wave together; /metrics right before and once all are booked after.

    ``scrape=False``: no /metrics around the wave (``delta`` None): the caller scrapes around a whole
    repeat, so the waves of a repeat follow each other with no idle gap (``run_start``).
    """
    before = _scrape(ep) if scrape else {}
    cpu0 = host_cpu_times()
    t0 = time.perf_counter()
    started_at = utc_now("milliseconds")
    results = send_together(ep, bodies, timeout_s=timeout_s)
    duration = time.perf_counter() - t0
    host_cpu = host_cpu_share(cpu0, host_cpu_times())
    ok = sum(1 for r in results if r is not None and r.get("error") is None)
    if ok < len(results):
        # The caller reports the failed stream; a scrape now could only fail on a server that died of it.
        return {"started_at": started_at, "duration_s": duration, "host_cpu": host_cpu, "delta": None,
                "streams": results}
    if not scrape:
        return {"started_at": started_at, "duration_s": duration, "host_cpu": host_cpu, "delta": None,
                "streams": results}
    after = settled_scrape(ep, before.get(COUNTERS["requests"], 0.0) + ok)
    delta = metrics_delta(before, after)
    return {"started_at": started_at, "duration_s": duration, "host_cpu": host_cpu,
            "delta": {name: delta.get(name, 0.0) for name in COUNTERS.values()}, "streams": results}


def _stream_record(s: Mapping[str, Any], **where) -> dict:
    # the generated text too: vllm bench serve's detailed result lists it (pairaudit.interop.vllm_bench)
    keep = ("started_at", "status", "error", "finish_reason", "output_tokens", "ttft_s", "tpot_s", "e2el_s", "itl_s",
            "chunks", "text")
    return {**where, **{k: s.get(k) for k in keep}}


def warm_up(ep: Endpoint, *, model: str, speed: SpeedSettings, prompts: Mapping[str, Any], start: str,
            arm: str, timed: bool = False) -> tuple[dict[str, float], list[dict]]:
    """One unmeasured wave of every cell, at its concurrency and output length, before any measured repeat.

    A server that compiles or captures per shape (CUDA graphs per batch size
    and context bucket, a compile cache) meets every shape the cells use
    here, not in the first measured repeat. With ``timed`` (the first start,
    when repeats are sized by time) every cell runs a second unmeasured wave:
    the first one's time is mostly capture and compilation (measured on an
    H200: 4.5-7 s for a wave the warm server runs in 0.8 s), which would size
    the repeats far too short. Returns each cell's last wave duration (what
    ``wave_plan`` sizes the repeats from) and the records.
    """
    out_len, timeout = speed.output_len, speed.request_timeout_s
    records: list[dict] = []
    durations: dict[str, float] = {}
    for c in [c for c in speed.cells for _ in range(2 if timed else 1)]:
        bodies = [request_body(model, prompts[c.name][(0, 0, i)], output_len=out_len,
                               seed=speed.base_seed - 1 - i) for i in range(c.concurrency)]
        base = _scrape(ep).get(COUNTERS["requests"], 0.0)
        t0 = time.perf_counter()
        streams = send_together(ep, bodies, timeout_s=timeout)
        durations[c.name] = time.perf_counter() - t0
        bad = failed_streams(streams)
        if bad:
            lead = bad[0][1]
            raise BracketFailure(f"{start} ({arm}): warm-up of {c.name} failed: {lead['error']}",
                                 what=f"{start} warm-up", kind=failures.classify(lead.get("status")),
                                 status=lead.get("status"), error=lead["error"], error_body=lead.get("body"),
                                 requests=bodies)
        settled_scrape(ep, base + len(bodies))
        for i, (b, st) in enumerate(zip(bodies, streams)):
            records.append(_stream_record(st, start=start, arm=arm, cell="warmup", warmup_of=c.name, repeat=None,
                                          wave=None, stream=i, seed=b["seed"], cache_salt=b["cache_salt"],
                                          prompt_tokens=len(b["prompt"]), wave_started_at=None,
                                          wave_host_cpu=None))
    return durations, records


def wave_plan(speed: SpeedSettings, durations: Mapping[str, float]) -> dict[str, int]:
    """Waves per repeat for each cell: the configured waves, raised so a repeat lasts ``repeat_s`` at least.

    Sized once, from the first start's warm-up, and used by every start of
    the bracket: the same waves mean the same prompts and seeds at each
    repeat index in every start.
    """
    plan = {}
    for c in speed.cells:
        waves = speed.waves
        d = durations.get(c.name)
        if speed.repeat_s and d and d > 0:
            waves = max(waves, math.ceil(speed.repeat_s / d - 1e-9))
        plan[c.name] = int(waves)
    return plan


def run_start(ep: Endpoint, *, model: str, speed: SpeedSettings, prompts: Mapping[str, Any],
              start: str, arm: str, plan: Mapping[str, int], progress: Progress | None = None) -> tuple[dict, list[dict]]:
    """One start's measurements: repeats x cells x waves (``plan``: waves per cell), after ``warm_up``.

    Returns (per cell: {"pooled": [per repeat], "bench_serve": table}, stream records).
    """
    records: list[dict] = []
    out_len, timeout = speed.output_len, speed.request_timeout_s
    per_cell: dict[str, dict[str, Any]] = {c.name: {"waves": [[] for _ in range(speed.repeats)], "streams": [],
                                                    "duration_s": 0.0}
                                           for c in speed.cells}
    for r in range(speed.repeats):
        for c in speed.cells:
            waves = plan[c.name]
            # /metrics once before a repeat's first wave and once after its last, not around every wave: the
            # waves then follow each other with no idle gap, and every stream meets a server that has just been
            # busy.  On vLLM (a host-bound decode loop at about 2 ms a token) each stream after a pause of
            # scrapes had its own pace (TPOT 10-17 % apart from stream to stream); the counters pooled over
            # a repeat are the same sums either way.
            before = _scrape(ep)
            booked = 0
            for w in range(waves):
                bodies = [request_body(model, prompts[c.name][(r, w, i)], output_len=out_len,
                                       seed=stream_seed(speed.base_seed, r, w, waves, i))
                          for i in range(c.concurrency)]
                wave = run_wave(ep, bodies, timeout_s=timeout, scrape=False)
                where = f"{start} cell {c.name} repeat {r} wave {w}"
                bad = failed_streams(wave["streams"])
                if bad:
                    # A failed stream would bias the pooled rate; the bracket is not comparable.
                    lead = bad[0][1]
                    every = "; ".join(f"stream {i}: {s['error']}" for i, s in bad)
                    raise BracketFailure(f"{start} ({arm}) {where[len(start) + 1:]}: {len(bad)} stream(s) failed: "
                                         f"{every}", what=where, kind=failures.classify(lead.get("status")),
                                         status=lead.get("status"), error=lead["error"],
                                         error_body=lead.get("body"), requests=bodies)
                short = [(b, s) for b, s in zip(bodies, wave["streams"]) if s.get("output_tokens") != out_len]
                if short:
                    clamp = clamping(short[0][0], short[0][1].get("finish_reason"), short[0][1].get("usage"))
                    why = clamp["reason"] if clamp["clamped"] else "ignore_eos/min_tokens not honoured?"
                    raise BracketFailure(f"{start} ({arm}) {where[len(start) + 1:]}: output lengths "
                                         f"{[s.get('output_tokens') for _, s in short]} != output_len {out_len} ({why})",
                                         what=where, kind=server_failure.FAILED_CHECK, status=short[0][1].get("status"),
                                         error=f"output length {short[0][1].get('output_tokens')} != {out_len}: {why}",
                                         requests=bodies)
                booked += len(bodies)
                if w == waves - 1:
                    # the repeat's counters on its last wave, nothing on the others: pool_repeat sums them
                    after = settled_scrape(ep, before.get(COUNTERS["requests"], 0.0) + booked)
                    delta = metrics_delta(before, after)
                    for earlier in per_cell[c.name]["waves"][r]:
                        earlier["delta"] = {name: 0.0 for name in COUNTERS.values()}
                    wave["delta"] = {name: delta.get(name, 0.0) for name in COUNTERS.values()}
                pc = per_cell[c.name]
                pc["waves"][r].append(wave)
                pc["streams"] += wave["streams"]
                pc["duration_s"] += wave["duration_s"]
                for i, (b, s) in enumerate(zip(bodies, wave["streams"])):
                    records.append(_stream_record(s, start=start, arm=arm, cell=c.name, repeat=r, wave=w,
                                                  stream=i, seed=b["seed"], cache_salt=b["cache_salt"],
                                                  prompt_tokens=len(b["prompt"]),
                                                  wave_started_at=wave["started_at"],
                                                  wave_host_cpu=wave["host_cpu"]))
                if progress is not None:
                    progress.step()
    result = {name: {"pooled": [pool_repeat(ws) for ws in pc["waves"]],
                     "wave_deltas": [[wv["delta"] for wv in ws] for ws in pc["waves"]],
                     "bench_serve": bench_serve_table(pc["streams"], pc["duration_s"])}
              for name, pc in per_cell.items()}
    return result, records


