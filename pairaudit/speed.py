"""Speed stage: the OFF/ON/OFF bracket decided by win2-v2 (default) or win2-v1.

``speed.rule`` selects the registered rule: win2-v2 (rules.win2_v2, the
default; docs/speed.md) decides over all deciding cells at once against an
interval that keeps the start-to-start noise, and says INCONCLUSIVE when the
window is too noisy to decide at the bar; win2-v1 (rules.win2_v1, kept
unchanged and selectable, reported as a deviation) pairs by repeat per cell.

One job runs three fresh servers on the same host, one after the other:
s1 = control, s2 = candidate, s3 = control, each from its arm's spec and
checked against its launch receipt. Every start runs the same cells with the
same seeds; every stream gets a fresh ``cache_salt``. Repeat r of the
decision pairs s2's repeat r with the mean of s1's and s3's repeat r.

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
The server's ``/metrics`` is scraped right before every wave and, after it,
once the server counts the wave's requests as finished (a client sees the
last chunk before the server books the request).

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
                   win2-v2's verdict is its own (rules.win2_v2).
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
                   (below) taken before the server starts, clock_after: the
                   same after its last wave, before it stops, started_at, stopped_at,
                   warmup: {error, ttft_s, e2el_s}, server: {pid, url,
                   ready_s, identity_check, stop}}]
    hosts:         sorted distinct hosts of the starts (one, by construction)
    deviations:    gate.stage_deviations (for decision.json)
    clock_check:   {cap_keys, caps: [cap facts per start], caps_after,
                   mismatch: [keys that differ], expected, off_expected:
                   [keys], throttled: [keys], within_start: [{start,
                   changed, before, after}], unverifiable: [{start, gaps}],
                   verdict: "OK"|"DIFFERENT"|"UNVERIFIABLE"}
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
error, finish_reason, output_tokens, ttft_s, tpot_s, e2el_s, itl_s (list),
chunks, wave_started_at; warm-up requests have ``cell: "warmup"``.

``results/control-archive.jsonl`` (outside any audit dir, append-only):
one line per finished control start and cell: {schema:
pairaudit.control_archive/v1, audit, time, start, cell, config_hash
(sha256 of the cell, output_len, waves, sampling and the control arm's
identity fields), metrics
{metric: mean over repeats}, per_repeat {metric: [..]}, clock, host}.

Clock facts per start (``clock_facts``): cpu_mhz (mean of /proc/cpuinfo),
governor, scaling_max_freq_khz, scaling_min_freq_khz (cpu0 cpufreq, null
when absent), loadavg [1, 5, 15], and when ``nvidia-smi`` exists ``gpus``:
per GPU {clocks.sm, clocks.max.sm, clocks.applications.graphics,
clocks_throttle_reasons.active, power.limit}. The *cap* facts (governor,
scaling_max_freq_khz, per GPU clocks.max.sm, clocks.applications.graphics,
power.limit and whether throttle reasons other than idle are active) must
be equal across the three starts, equal within each start (before it and
after its last wave: a governor or max frequency that moved, GPU clocks or
power limit that moved, a throttle reason that appeared), and show no
throttle reason, else the gate is INCONCLUSIVE under either rule. A start
without clock facts (no cpufreq, no nvidia-smi: typical of a VM) makes the
gate INCONCLUSIVE ("clock unverifiable") unless ``speed.
accept_unverifiable_clock: true``, which is then listed as a deviation. CPU
MHz and load average are recorded, not decisive.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import shutil
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from . import artifacts, failures, launch, rules, schema
from .client import Endpoint, ServerError, clamping, metrics_delta, tail_lines, utc_now
from .progress import Progress

log = logging.getLogger("pairaudit")


class BracketFailure(RuntimeError):
    """A start of the bracket could not be measured: the server failed a stream or broke the workload's terms."""

    def __init__(self, msg: str, *, what: str, kind: str, status: int | None, error: str | None,
                 error_body: Any = None, requests: Sequence[dict] = ()):
        super().__init__(msg)
        self.what, self.kind, self.status, self.error = what, kind, status, error
        self.error_body, self.requests = error_body, list(requests)

SCHEMA = "pairaudit.speed_decision/v1"
STREAMS_SCHEMA = "pairaudit.speed_streams/v1"
ARCHIVE_SCHEMA = "pairaudit.control_archive/v1"
START_ROLES = (("s1", "control_before", "control"), ("s2", "candidate", "candidate"),
               ("s3", "control_after", "control"))
PROMPT_KINDS = ("short", "long", "random", "repetitive")
METRICS = ("pooled_rate_tps", "accepted_per_round", "ms_per_round", "decode_tps", "ttft_s")
LOWER_IS_BETTER = frozenset({"ms_per_round", "ttft_s"})
RULES = ("win2-v2", "win2-v1")

# A GPU audit's defaults (the schema's). The embedded config/config.yaml
# shrinks them so one bracket fits in minutes on a 2-core CPU.
DEFAULTS: dict[str, Any] = schema.defaults("speed")


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
    ecc = out["expected_clock_cap"]
    if ecc is not None and not isinstance(ecc, dict):
        raise SpeedConfigError("speed.expected_clock_cap: must be a mapping of cap fact -> value "
                               f"(facts: {', '.join(CAP_KEYS)}, gpu<i>.<field>), or null")
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
        cc = {"name": name, "prompt": c["prompt"], "input_len": c.get("input_len", 32),
              "concurrency": c.get("concurrency", 1), "decide": c.get("decide", True)}
        for k in ("input_len", "concurrency"):
            if isinstance(cc[k], bool) or not isinstance(cc[k], int) or cc[k] < 1:
                raise SpeedConfigError(f"{w}.{k}: {cc[k]!r} is not a positive integer")
        if not isinstance(cc["decide"], bool):
            raise SpeedConfigError(f"{w}.decide: {cc['decide']!r} is not one of true, false")
        resolved.append(cc)
    if not any(c["decide"] for c in resolved):
        raise SpeedConfigError("speed.cells: no cell has decide: true; the verdict needs a decision cell")
    out["cells"] = resolved
    return out


# ------------------------------------------------------------- clock facts

CAP_KEYS = ("governor", "scaling_max_freq_khz")
GPU_FIELDS = ("clocks.sm", "clocks.max.sm", "clocks.applications.graphics",
              "clocks_throttle_reasons.active", "power.limit")
GPU_CAP_FIELDS = ("clocks.max.sm", "clocks.applications.graphics", "power.limit")
# Reasons that say nothing about a cap: an idle GPU or one held back by the
# application clock setting itself (compared separately).
_BENIGN_THROTTLE = {0x0, 0x1, 0x2}


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def gpu_facts(exe: str | None = None) -> list[dict] | None:
    exe = exe or shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        res = subprocess.run([exe, f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return [{"error": f"nvidia-smi failed: {exc}"}]
    if res.returncode != 0:
        return [{"error": f"nvidia-smi exit {res.returncode}: {res.stderr.strip()[:200]}"}]
    return [dict(zip(GPU_FIELDS, (v.strip() for v in line.split(","))))
            for line in res.stdout.splitlines() if line.strip()]


def clock_facts() -> dict:
    """What the clocks were at one start: recorded per start, the cap facts compared across starts."""
    mhz = []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("cpu mhz"):
                mhz.append(float(line.split(":", 1)[1]))
    except (OSError, ValueError):
        pass
    cf = "/sys/devices/system/cpu/cpu0/cpufreq"
    maxf, minf = _read(f"{cf}/scaling_max_freq"), _read(f"{cf}/scaling_min_freq")
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    return {"time": utc_now(), "cpu_mhz": float(np.mean(mhz)) if mhz else None,
            "cpu_mhz_min": min(mhz) if mhz else None, "cpu_mhz_max": max(mhz) if mhz else None,
            "governor": _read(f"{cf}/scaling_governor"),
            "scaling_max_freq_khz": int(maxf) if maxf and maxf.isdigit() else None,
            "scaling_min_freq_khz": int(minf) if minf and minf.isdigit() else None,
            "loadavg": load, "cpu_count": os.cpu_count(), "gpus": gpu_facts()}


def _throttled(reasons: str | None) -> bool | None:
    if reasons is None or reasons in ("", "[N/A]", "N/A", "[Not Supported]"):
        return None
    try:
        return int(reasons, 16) not in _BENIGN_THROTTLE
    except ValueError:
        return None


def cap_facts(facts: Mapping[str, Any]) -> dict:
    """The facts that must be equal across the bracket's starts (load and current MHz are not)."""
    cap = {k: facts.get(k) for k in CAP_KEYS}
    for i, g in enumerate(facts.get("gpus") or []):
        for f in GPU_CAP_FIELDS:
            cap[f"gpu{i}.{f}"] = g.get(f)
        cap[f"gpu{i}.throttled"] = _throttled(g.get("clocks_throttle_reasons.active"))
        if "error" in g:
            cap[f"gpu{i}.error"] = g["error"]
    return cap


def clock_gaps(facts: Mapping[str, Any]) -> list[str]:
    """Why one reading cannot vouch for the clocks ([] when it can).

    A reading vouches when it has a CPU cap fact (cpufreq governor or max
    frequency) or GPU facts, and no GPU query failed. A VM without cpufreq
    and without nvidia-smi has none: its clocks are unverifiable.
    """
    gaps = []
    gpus = facts.get("gpus") or []
    for i, g in enumerate(gpus):
        if "error" in g:
            gaps.append(f"gpu{i}: {g['error']}")
    cpu = facts.get("governor") is not None or facts.get("scaling_max_freq_khz") is not None
    if not cpu and not gpus:
        gaps.append("no cpufreq governor or max frequency and no nvidia-smi")
    return gaps


def clock_check(facts_per_start: Sequence[Mapping[str, Any]], expected: Mapping[str, Any] | None = None,
                after: Sequence[Mapping[str, Any]] | None = None,
                starts: Sequence[str] = ("s1", "s2", "s3")) -> dict:
    """Cap facts across the starts, and within each start (before it vs after its last wave).

    verdict: DIFFERENT when the starts' cap facts differ, differ from
    ``expected``, a GPU reports a throttle reason (before or after), or a
    start's facts after its work differ from its facts before (a governor or
    max frequency changed, a GPU's clocks or power limit moved, a throttle
    reason appeared); else UNVERIFIABLE when some reading has no clock facts
    at all (``clock_gaps``); else OK.
    """
    caps = [cap_facts(f) for f in facts_per_start]
    caps_after = [cap_facts(f) for f in after] if after is not None else []
    keys = sorted(set().union(*caps)) if caps else []
    mismatch = [k for k in keys if len({json.dumps(c.get(k)) for c in caps}) > 1]
    off = sorted(k for k, v in (expected or {}).items() if any(str(c.get(k)) != str(v) for c in caps))
    throttled = sorted(k for c in caps + caps_after for k, v in c.items() if k.endswith(".throttled") and v)
    within = []
    for name, b, a in zip(starts, caps, caps_after):
        changed = sorted(k for k in set(b) | set(a) if json.dumps(b.get(k)) != json.dumps(a.get(k)))
        if changed:
            within.append({"start": name, "changed": changed,
                           "before": {k: b.get(k) for k in changed}, "after": {k: a.get(k) for k in changed}})
    unverifiable = []
    for name, f, fa in zip(starts, facts_per_start, list(after) if after is not None else [None] * len(caps)):
        gaps = clock_gaps(f) + ([] if fa is None else [f"after: {g}" for g in clock_gaps(fa)])
        if gaps:
            unverifiable.append({"start": name, "gaps": gaps})
    if mismatch or off or throttled or within:
        verdict = "DIFFERENT"
    elif unverifiable:
        verdict = "UNVERIFIABLE"
    else:
        verdict = "OK"
    return {"cap_keys": keys, "caps": caps, "caps_after": caps_after, "mismatch": mismatch,
            "expected": dict(expected or {}), "off_expected": off, "throttled": sorted(set(throttled)),
            "within_start": within, "unverifiable": unverifiable, "verdict": verdict}


def clock_findings(clock: Mapping[str, Any], cfg: Mapping[str, Any]) -> tuple[list[str], list[dict]]:
    """(reasons that make the gate INCONCLUSIVE, deviations) from a clock_check.

    Every condition the rule itself does not see is here, so win2-v1 and
    win2-v2 are held to the same clocks.
    """
    incon, devs = [], []
    if clock.get("off_expected"):
        incon.append(f"clock cap facts {clock['off_expected']} differ from "
                     f"speed.expected_clock_cap {clock.get('expected')}")
    for w in clock.get("within_start") or []:
        incon.append(f"{w['start']}: clock facts changed during the start ({', '.join(w['changed'])}: "
                     f"before {w['before']}, after {w['after']})")
    if clock.get("throttled"):
        incon.append(f"throttling was flagged inside the bracket ({', '.join(clock['throttled'])})")
    unv = clock.get("unverifiable") or []
    if unv:
        what = "; ".join(f"{u['start']}: {', '.join(u['gaps'])}" for u in unv)
        if cfg.get("accept_unverifiable_clock"):
            devs.append({"gate": "speed", "what": "accept_unverifiable_clock",
                         "detail": f"clock unverifiable, accepted by speed.accept_unverifiable_clock ({what}): "
                                   "a start may have run at another clock than the others"})
        else:
            incon.append(f"clock unverifiable ({what}); speed.accept_unverifiable_clock: true accepts this "
                         "as a reported deviation")
    return incon, devs


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


def build_prompts(ep: Endpoint, model: str, cells: Sequence[Mapping[str, Any]], repeats: int, waves: int,
                  base_seed: int) -> dict:
    """cell -> (r, w, i) -> token ids: built once, sent unchanged to every start.

    Token-id prompts make every start see exactly the same input whatever its
    chat template or tokenizer settings. ``random`` draws ids from the
    tokenized filler text (real, non-special tokens), seeded per stream.
    """
    long_ids = _tokenize(ep, model, long_text(40 + max(c["input_len"] for c in cells) // 8, seed=base_seed))
    need = max(c["input_len"] for c in cells)
    while len(long_ids) < need:
        long_ids = long_ids + long_ids  # only reached for very long cells; still valid input
    short_ids = _tokenize(ep, model, SHORT_PROMPT)
    rep_unit = _tokenize(ep, model, REPETITIVE_UNIT)
    vocab = sorted(set(long_ids))
    out: dict = {}
    for c in cells:
        n = c["input_len"]
        per: dict = {}
        for r in range(repeats):
            for w in range(waves):
                for i in range(c["concurrency"]):
                    if c["prompt"] == "short":
                        ids = short_ids[:n]
                    elif c["prompt"] == "long":
                        ids = long_ids[-n:]  # keep the closing instruction
                    elif c["prompt"] == "repetitive":
                        ids = (rep_unit * (n // len(rep_unit) + 1))[:n]
                    else:
                        rng = random.Random(f"{base_seed}:{c['name']}:{r}:{w}:{i}")
                        ids = [rng.choice(vocab) for _ in range(n)]
                    per[(r, w, i)] = ids
        out[c["name"]] = per
    return out


def request_body(model: str, prompt_ids: list[int], *, output_len: int, seed: int) -> dict:
    return {"model": model, "prompt": prompt_ids, "max_tokens": output_len, "min_tokens": output_len,
            "ignore_eos": True, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "seed": seed,
            "cache_salt": uuid.uuid4().hex}


def stream_seed(base_seed: int, r: int, w: int, waves: int, i: int) -> int:
    return base_seed + 1000 * (r * waves + w) + i


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


_C = {"requests": "vllm:request_success_total", "generation_tokens": "vllm:generation_tokens_total",
      "accepted": "vllm:spec_decode_num_accepted_tokens_total", "drafts": "vllm:spec_decode_num_drafts_total",
      "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
      "decode_s": "vllm:request_decode_time_seconds_sum"}


def pool_repeat(waves: Sequence[Mapping[str, Any]]) -> dict:
    """Pool one repeat's waves (each ``{"delta": {metric: value}, "streams": [...]}``) into its metrics.

    Counters are summed over the waves before any ratio (pooled, as a speed audit pools its waves),
    so a short wave does not weigh as much as a long one.
    """
    tot = {k: sum(float(w["delta"].get(name, 0.0)) for w in waves) for k, name in _C.items()}
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


# ------------------------------------------------------------------ running

def _scrape(ep: Endpoint) -> dict[str, float]:
    res, parsed = ep.scrape_metrics(timeout_s=60)
    if parsed is None:
        why = res["error"] or "not Prometheus text"
        raise BracketFailure(f"/metrics scrape failed: {why}", what="GET /metrics",
                             kind=failures.classify(res.get("status")) if res["error"] else failures.FAILED_CHECK,
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
        if m.get(_C["requests"], 0.0) >= finished or time.monotonic() > deadline:
            if m.get(_C["requests"], 0.0) < finished:
                raise RuntimeError(f"/metrics still counts {m.get(_C['requests'], 0.0):g} finished requests "
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


def run_wave(ep: Endpoint, bodies: Sequence[dict], *, timeout_s: float) -> dict:
    """Start every stream of the wave together; /metrics right before and once all are booked after."""
    before = _scrape(ep)
    t0 = time.perf_counter()
    started_at = utc_now()
    results = send_together(ep, bodies, timeout_s=timeout_s)
    duration = time.perf_counter() - t0
    ok = sum(1 for r in results if r is not None and r.get("error") is None)
    if ok < len(results):
        # The caller reports the failed stream; a scrape now could only fail on a server that died of it.
        return {"started_at": started_at, "duration_s": duration, "delta": None, "streams": results}
    after = settled_scrape(ep, before.get(_C["requests"], 0.0) + ok)
    delta = metrics_delta(before, after)
    return {"started_at": started_at, "duration_s": duration,
            "delta": {name: delta.get(name, 0.0) for name in _C.values()}, "streams": results}


def _stream_record(s: Mapping[str, Any], **where) -> dict:
    keep = ("status", "error", "finish_reason", "output_tokens", "ttft_s", "tpot_s", "e2el_s", "itl_s", "chunks")
    return {**where, **{k: s.get(k) for k in keep}}


def run_start(ep: Endpoint, *, model: str, cfg: Mapping[str, Any], prompts: Mapping[str, Any],
              start: str, arm: str, progress: Progress | None = None) -> tuple[dict, list[dict]]:
    """One start's measurements: warm-up, then repeats x cells x waves.

    Returns (per cell: {"pooled": [per repeat], "bench_serve": table}, stream records).
    """
    records: list[dict] = []
    out_len, waves, timeout = cfg["output_len"], cfg["waves"], cfg["request_timeout_s"]
    first = cfg["cells"][0]
    warm_body = request_body(model, prompts[first["name"]][(0, 0, 0)], output_len=out_len, seed=cfg["base_seed"] - 1)
    base = _scrape(ep).get(_C["requests"], 0.0)
    warm = ep.stream_completion("/v1/completions", warm_body, timeout_s=timeout)
    if warm.get("error") is not None:
        raise BracketFailure(f"{start} ({arm}): warm-up request failed: {warm['error']}", what=f"{start} warm-up",
                             kind=failures.classify(warm.get("status")), status=warm.get("status"),
                             error=warm["error"], error_body=warm.get("body"), requests=[warm_body])
    settled_scrape(ep, base + 1)
    records.append(_stream_record(warm, start=start, arm=arm, cell="warmup", repeat=None, wave=None, stream=0,
                                  seed=warm_body["seed"], cache_salt=warm_body["cache_salt"],
                                  prompt_tokens=len(warm_body["prompt"]), wave_started_at=None))
    per_cell = {c["name"]: {"waves": [[] for _ in range(cfg["repeats"])], "streams": [], "duration_s": 0.0}
                for c in cfg["cells"]}
    for r in range(cfg["repeats"]):
        for c in cfg["cells"]:
            for w in range(waves):
                bodies = [request_body(model, prompts[c["name"]][(r, w, i)], output_len=out_len,
                                       seed=stream_seed(cfg["base_seed"], r, w, waves, i))
                          for i in range(c["concurrency"])]
                wave = run_wave(ep, bodies, timeout_s=timeout)
                where = f"{start} cell {c['name']} repeat {r} wave {w}"
                bad = [s for s in wave["streams"] if s.get("error") is not None]
                if bad:
                    # A failed stream would bias the pooled rate; the bracket is not comparable.
                    raise BracketFailure(f"{start} ({arm}) {where[len(start) + 1:]}: {len(bad)} stream(s) failed: "
                                         f"{bad[0]['error']}", what=where, kind=failures.classify(bad[0].get("status")),
                                         status=bad[0].get("status"), error=bad[0]["error"],
                                         error_body=bad[0].get("body"), requests=bodies)
                short = [(b, s) for b, s in zip(bodies, wave["streams"]) if s.get("output_tokens") != out_len]
                if short:
                    clamp = clamping(short[0][0], short[0][1].get("finish_reason"), short[0][1].get("usage"))
                    why = clamp["reason"] if clamp["clamped"] else "ignore_eos/min_tokens not honoured?"
                    raise BracketFailure(f"{start} ({arm}) {where[len(start) + 1:]}: output lengths "
                                         f"{[s.get('output_tokens') for _, s in short]} != output_len {out_len} ({why})",
                                         what=where, kind=failures.FAILED_CHECK, status=short[0][1].get("status"),
                                         error=f"output length {short[0][1].get('output_tokens')} != {out_len}: {why}",
                                         requests=bodies)
                pc = per_cell[c["name"]]
                pc["waves"][r].append(wave)
                pc["streams"] += wave["streams"]
                pc["duration_s"] += wave["duration_s"]
                for i, (b, s) in enumerate(zip(bodies, wave["streams"])):
                    records.append(_stream_record(s, start=start, arm=arm, cell=c["name"], repeat=r, wave=w,
                                                  stream=i, seed=b["seed"], cache_salt=b["cache_salt"],
                                                  prompt_tokens=len(b["prompt"]),
                                                  wave_started_at=wave["started_at"]))
                if progress is not None:
                    progress.step()
    result = {name: {"pooled": [pool_repeat(ws) for ws in pc["waves"]],
                     "wave_deltas": [[wv["delta"] for wv in ws] for ws in pc["waves"]],
                     "bench_serve": bench_serve_table(pc["streams"], pc["duration_s"])}
              for name, pc in per_cell.items()}
    return result, records


# ----------------------------------------------------------------- decision

def series_for(cell_results: Mapping[str, Mapping[str, Any]], metrics: Iterable[str]) -> dict:
    """metric -> per repeat [s1, s2, s3] from ``{start: {"pooled": [per repeat]}}``."""
    starts = [s for s, _, _ in START_ROLES]
    n = len(cell_results[starts[0]]["pooled"])
    return {m: [[cell_results[s]["pooled"][r][m] for s in starts] for r in range(n)] for m in metrics}


def combine(cell_verdicts: Mapping[str, Mapping[str, Any]], decision_cells: Sequence[str], *,
            informational: bool, clock: Mapping[str, Any] | None = None) -> dict:
    """The speed gate over the decision cells' win2-v1 results (see module docstring)."""
    verdicts = {c: cell_verdicts[c]["verdict"] for c in cell_verdicts}
    dec = [verdicts[c] for c in decision_cells]
    if "LOSS" in dec:
        verdict = "LOSS"
    elif "INCONCLUSIVE" in dec or not dec:
        verdict = "INCONCLUSIVE"
    elif all(v == "WIN" for v in dec):
        verdict = "WIN"
    else:
        verdict = "NO_WIN"
    reasons = [f"{c} ({'decides' if c in decision_cells else 'reported only'}): {verdicts[c]}; "
               + "; ".join(cell_verdicts[c]["reasons"][:2]) for c in cell_verdicts]
    if informational:
        reasons.append("speed is informational (config speed.informational): only a LOSS gates the decision")
    first = cell_verdicts[decision_cells[0]] if decision_cells else {}
    return {"rule": "win2-v1", "verdict": verdict, "reasons": reasons, "params": first.get("params", {}),
            "deviations": first.get("deviations", {}), "informational": bool(informational),
            "decision_cells": list(decision_cells), "cells": verdicts,
            "clock_check": None if clock is None else clock.get("verdict")}


def spread_stats(values: Sequence[float]) -> dict:
    v = [float(x) for x in values if x is not None and math.isfinite(x)]
    if len(v) < 2:
        return {"n": len(v), "range_pct": None, "cv_pct": None, "mean": float(np.mean(v)) if v else None}
    a = np.asarray(v)
    return {"n": len(v), "mean": float(a.mean()), "range_pct": float(100.0 * (a.max() - a.min()) / abs(a.mean())),
            "cv_pct": float(100.0 * a.std(ddof=1) / abs(a.mean()))}


def _clean(obj: Any) -> Any:
    """JSON without NaN/inf (a 0/0 ratio is 'no value', not a number)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


# ------------------------------------------------------------------ archive

def config_hash(cell: Mapping[str, Any], cfg: Mapping[str, Any], control_spec: Mapping[str, Any]) -> str:
    """Which archived control starts are comparable: same cell, request shape and control server."""
    return artifacts.sha256_obj({"cell": dict(cell), "output_len": cfg["output_len"], "waves": cfg["waves"],
                                 "sampling": {"temperature": 1.0, "top_p": 1.0, "ignore_eos": True},
                                 "control": launch.identity_fields(dict(control_spec))})


def read_archive(path: str | os.PathLike) -> list[dict]:
    p = Path(path)
    if not p.exists():
        return []
    out = []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            log.warning("%s:%d: unreadable archive line skipped", p, n)
            continue
        if rec.get("schema") == ARCHIVE_SCHEMA:
            out.append(rec)
    return out


def append_archive(path: str | os.PathLike, records: Iterable[Mapping[str, Any]]) -> int:
    """Append-only: open in 'a' mode, one line per record, flushed and fsynced; never rewritten."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(p, "a") as f:
        for rec in records:
            f.write(json.dumps(_clean({"schema": ARCHIVE_SCHEMA, **rec}), ensure_ascii=False) + "\n")
            n += 1
        f.flush()
        os.fsync(f.fileno())
    return n


def archive_spread(records: Sequence[Mapping[str, Any]], cell: str, chash: str, metric: str) -> dict:
    vals = [r["metrics"].get(metric) for r in records if r.get("cell") == cell and r.get("config_hash") == chash]
    return spread_stats(vals)


# -------------------------------------------------------------------- stage

def _host_facts() -> dict:
    return {"host": socket.gethostname(), "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "slurmd_nodename": os.environ.get("SLURMD_NODENAME")}


def _archive_line(*, audit: str, start: str, cell: Mapping[str, Any], chash: str, pooled: Sequence[Mapping],
                  clock: Mapping, host: str) -> dict:
    per_repeat = {m: [p[m] for p in pooled] for m in METRICS}
    means = {m: (float(np.mean(v)) if all(x is not None for x in v) else None) for m, v in per_repeat.items()}
    return {"audit": audit, "time": utc_now(), "start": start, "cell": cell["name"], "config_hash": chash,
            "metrics": means, "per_repeat": per_repeat, "clock": dict(clock), "host": host}


def _rule_deviations(rule: str, res: Mapping[str, Any]) -> list[dict]:
    devs = [{"gate": "speed", "what": f"rule.{k}", "detail": f"{rule} {k}={v['used']!r} instead of the "
             f"registered {v['registered']!r}"} for k, v in (res.get("deviations") or {}).items()]
    if rule != RULES[0]:
        devs.append({"gate": "speed", "what": "rule", "detail": f"speed.rule {rule} instead of the default "
                     f"{RULES[0]} (win2-v1 does not bound its false WIN/LOSS under start-level noise)"})
    return devs


def _decide_v1(series: Mapping[str, Mapping], cfg: Mapping[str, Any], clock: Mapping[str, Any],
               archive_pct: Mapping[str, float | None], incon: list[str]) -> tuple[dict, dict]:
    metrics = [cfg["primary"], *cfg["guards"], *cfg["reported"]]
    caps = [json.dumps(c, sort_keys=True) for c in clock["caps"]]
    win2 = {}
    for c in cfg["cells"]:
        name, s = c["name"], series[c["name"]]
        missing = sorted({m for m, reps in s.items() for tr in reps for x in tr if x is None})
        if missing:
            win2[name] = {"rule": "win2-v1", "verdict": "INCONCLUSIVE", "params": {}, "deviations": {},
                          "reasons": [f"metric(s) {missing} have no value in some repeat (0 rounds or 0 "
                                      "decode seconds): nothing to compare"]}
            continue
        res = rules.win2_v1(s, primary=cfg["primary"], guards=cfg["guards"], reported=cfg["reported"],
                            win_pct=cfg["win_pct"], clock_caps=caps,
                            lower_is_better=[m for m in metrics if m in LOWER_IS_BETTER],
                            throttled=bool(clock["throttled"]), archive_spread_pct=archive_pct.get(name))
        # win2-v1 itself sees cap mismatches and throttling; the rest is the stage's.
        own = [r for r in incon if not r.startswith("throttling was flagged")]
        if own:
            res["verdict"] = "INCONCLUSIVE"
            res["reasons"][:0] = own
        if clock["mismatch"]:
            res["reasons"].insert(0, f"starts differ in clock cap facts {clock['mismatch']}")
        win2[name] = res
    gate = combine(win2, [c["name"] for c in cfg["cells"] if c["decide"]],
                   informational=cfg["informational"], clock=clock)
    return win2, gate


def _decide_v2(series: Mapping[str, Mapping], cfg: Mapping[str, Any], clock: Mapping[str, Any],
               archive_pct: Mapping[str, float | None], incon: list[str]) -> tuple[dict, dict]:
    metrics = [cfg["primary"], *cfg["guards"], *cfg["reported"]]
    deciding = [c["name"] for c in cfg["cells"] if c["decide"]]
    missing = {name: sorted({m for m, reps in series[name].items() for tr in reps for x in tr if x is None})
               for name in series}
    usable = [n for n in series if not missing[n]]
    kw = dict(primary=cfg["primary"], guards=cfg["guards"], reported=cfg["reported"],
              lower_is_better=[m for m in metrics if m in LOWER_IS_BETTER], win_pct=cfg["win_pct"],
              start_noise_pct=cfg["start_noise_pct"])
    blocked = [n for n in deciding if missing[n]]
    if blocked or not usable:
        res = {"rule": "win2-v2", "verdict": "INCONCLUSIVE", "params": {}, "deviations": {}, "cells": {},
               "noise": None, "rates": None,
               "reasons": [f"{n}: metric(s) {missing[n]} have no value in some repeat (0 rounds or 0 decode "
                           "seconds): nothing to compare" for n in blocked]}
    else:
        res = rules.win2_v2({n: series[n] for n in usable}, decide=deciding, **kw)
    if clock["mismatch"]:
        incon = [f"starts differ in clock cap facts {clock['mismatch']}", *incon]
    if incon:
        res["verdict"] = "INCONCLUSIVE"
        res["reasons"][:0] = incon
    per_cell = dict(res.get("cells") or {})
    for n in series:
        if missing[n]:
            per_cell[n] = {"decides": n in deciding, "verdict": "INCONCLUSIVE",
                           "reasons": [f"metric(s) {missing[n]} have no value in some repeat"]}
        per_cell[n]["archive_spread_pct"] = archive_pct.get(n)
    win2 = {n: {"rule": "win2-v2", **per_cell[n]} for n in series}
    reasons = list(res["reasons"])
    if cfg["informational"]:
        reasons.append("speed is informational (config speed.informational): only a LOSS gates the decision")
    gate = {"rule": "win2-v2", "verdict": res["verdict"], "reasons": reasons, "params": res.get("params", {}),
            "deviations": res.get("deviations", {}), "informational": bool(cfg["informational"]),
            "decision_cells": deciding, "cells": {n: win2[n].get("verdict") for n in win2},
            "clock_check": clock.get("verdict"),
            **{k: res.get(k) for k in ("noise", "rates", "needed", "pooled_gain_pct", "half_width_pct",
                                       "lower_bound_pct", "loss_tests", "repeats", "reported")}}
    return win2, gate


def decide(results: Mapping[str, Mapping[str, Any]], cfg: Mapping[str, Any], clock: Mapping[str, Any],
           archive_pct: Mapping[str, float | None] | None = None) -> tuple[dict, dict, dict]:
    """(win2 per cell, series per cell, gate) from ``results[start][cell]["pooled"]`` under ``cfg["rule"]``.

    Clock findings (``clock_findings``) make the gate INCONCLUSIVE under either
    rule; the gate carries ``stage_deviations`` (list of {gate, what,
    detail}): an accepted unverifiable clock, a non-default rule, rule
    parameters off their registered values.
    """
    metrics = [cfg["primary"], *cfg["guards"], *cfg["reported"]]
    rule = cfg.get("rule", RULES[0])
    series = {c["name"]: series_for({st: results[st][c["name"]] for st, _, _ in START_ROLES}, metrics)
              for c in cfg["cells"]}
    incon, devs = clock_findings(clock, cfg)
    fn = _decide_v2 if rule == "win2-v2" else _decide_v1
    win2, gate = fn(series, cfg, clock, archive_pct or {}, incon)
    rule_res = gate if rule == "win2-v2" else next((w for w in win2.values() if w.get("deviations")), {})
    gate["stage_deviations"] = devs + _rule_deviations(rule, rule_res)
    for d in devs:
        gate["reasons"].append(f"deviation: {d['detail']}")
    return win2, series, gate


def speed_stage(*, launch_paths: Mapping[str, str], preflight_paths: Mapping[str, str], arm_cfgs: Mapping[str, Any],
                speed_cfg: Mapping[str, Any] | None, audit: str, out_path: str, streams_path: str,
                archive_path: str, server_logs: Mapping[str, str], starts_log: str | None = None) -> dict:
    """Run the OFF/ON/OFF bracket and write decision.json + streams.jsonl (module docstring)."""
    cfg = resolve_config(speed_cfg)
    receipts, specs = {}, {}
    failed = {arm: artifacts.read_json(preflight_paths[arm]) for arm in ("control", "candidate")}
    failed = {arm: pf for arm, pf in failed.items() if pf.get("verdict") != "PASS"}
    if failed:
        # a server that failed its rehearsal is evidence of the servers gate; no bracket is measured
        why = "; ".join(f"the {arm} preflight is {pf.get('verdict')} at probe {pf.get('failed_probe')!r}"
                        for arm, pf in failed.items())
        prov = artifacts.provenance([*launch_paths.values(), *preflight_paths.values()], {"speed": cfg})
        artifacts.write_jsonl(streams_path, {"schema": STREAMS_SCHEMA, "audit": audit, "provenance": prov}, [])
        doc = {"schema": SCHEMA, "audit": audit, "not_run": why, "params": cfg, "provenance": prov,
               "gate": {"rule": cfg["rule"], "verdict": "INCONCLUSIVE", "reasons": [f"not run: {why}"]}}
        artifacts.write_json(out_path, doc)
        return doc
    for arm in ("control", "candidate"):
        receipts[arm] = artifacts.check_schema(artifacts.read_json(launch_paths[arm]), launch.RECEIPT_SCHEMA,
                                               launch_paths[arm])
        specs[arm] = launch.resolve_spec(arm, arm_cfgs[arm])
    model = specs["control"]["served_model_name"]
    if specs["candidate"]["served_model_name"] != model:
        raise RuntimeError("speed: the arms serve different model names "
                           f"({model!r} vs {specs['candidate']['served_model_name']!r}); one prompt set cannot fit both")
    hashes = {c["name"]: config_hash(c, cfg, specs["control"]) for c in cfg["cells"]}
    prior = read_archive(archive_path)
    prior_spread = {c["name"]: archive_spread(prior, c["name"], hashes[c["name"]], cfg["primary"])
                    for c in cfg["cells"]}
    n_waves = 3 * cfg["repeats"] * cfg["waves"] * len(cfg["cells"])
    progress = Progress(n_waves, "speed waves")
    starts, results, records, prompts, appended = [], {}, [], None, 0
    for start, role, arm in START_ROLES:
        rec = {"start": start, "role": role, "arm": arm, **_host_facts(), "clock": clock_facts(),
               "started_at": utc_now(), "stopped_at": None}
        log.info("speed %s: %s arm, fresh server", start, arm)
        try:
            facts, recs = _measure_start(start, arm, specs[arm], receipts[arm], rec, cfg=cfg, model=model,
                                         prompts=prompts, results=results, progress=progress,
                                         server_log=server_logs[start], starts_log=starts_log)
        except (BracketFailure, ServerError) as exc:
            # A server that fails under the bracket is evidence, and what it measured before stays.
            return _failed_bracket(exc, start=start, arm=arm, rec=rec, starts=starts, records=records, specs=specs,
                                   receipts=receipts, cfg=cfg, audit=audit, out_path=out_path,
                                   streams_path=streams_path, server_logs=server_logs, starts_log=starts_log,
                                   inputs=[*launch_paths.values(), *preflight_paths.values()])
        prompts = prompts or facts.pop("prompts")
        records += recs
        starts.append(rec)
        if arm == "control":
            appended += append_archive(archive_path, [
                _archive_line(audit=audit, start=start, cell=c, chash=hashes[c["name"]],
                              pooled=results[start][c["name"]]["pooled"], clock=rec["clock"], host=rec["host"])
                for c in cfg["cells"]])
    return _decided_bracket(cfg=cfg, audit=audit, starts=starts, results=results, records=records, prompts=prompts,
                            hashes=hashes, prior_spread=prior_spread, archive_path=archive_path, appended=appended,
                            inputs=[*launch_paths.values(), *preflight_paths.values()], out_path=out_path,
                            streams_path=streams_path)


def _measure_start(start: str, arm: str, spec: dict, receipt: dict, rec: dict, *, cfg: Mapping[str, Any], model: str,
                   prompts: Mapping[str, Any] | None, results: dict, progress: Progress, server_log: str,
                   starts_log: str | None) -> tuple[dict, list[dict]]:
    """One fresh start: its measurements into ``results[start]``, its facts into ``rec``.

    Returns the server's facts (with the bracket's ``prompts`` when they were built here) and the stream records.
    """
    with launch.Server(spec, log_path=server_log, receipt=receipt, timeout_s=cfg["request_timeout_s"]) as srv:
        launch.log_start_event(starts_log, event="ready", phase="speed", spec=spec, receipt=receipt,
                               facts=srv.facts())
        if prompts is None:
            # built once, on the first start, from that server's own tokenizer
            prompts = build_prompts(srv.endpoint, model, cfg["cells"], cfg["repeats"], cfg["waves"], cfg["base_seed"])
        results[start], recs = run_start(srv.endpoint, model=model, cfg=cfg, prompts=prompts, start=start,
                                         arm=arm, progress=progress)
        # Read while the server still holds its clocks: a GPU's throttle
        # reasons clear soon after the load stops.
        rec["clock_after"] = clock_facts()
        srv.assert_alive()
        facts = dict(srv.facts())
    rec["stopped_at"] = utc_now()
    launch.log_start_event(starts_log, event="stopped", phase="speed", spec=spec, receipt=receipt,
                           facts={"stop": facts.get("stop"), "pid": facts.get("pid")})
    rec["server"] = {k: facts.get(k) for k in ("pid", "url", "ready_s", "identity_check", "stop")}
    rec["warmup"] = next({k: r[k] for k in ("error", "ttft_s", "e2el_s")} for r in recs if r["cell"] == "warmup")
    facts["prompts"] = prompts
    return facts, recs


def _start_failure(exc: BaseException, *, start: str, arm: str, server_log: str) -> failures.FailureRecord:
    if isinstance(exc, BracketFailure):
        return {"arm": arm, "stage": "speed", "what": exc.what, "kind": exc.kind, "status": exc.status,
                "request": {"method": "POST", "path": "/v1/completions", "bodies": exc.requests},
                "error": exc.error, "error_body": exc.error_body, "log_tail": tail_lines(server_log, 40),
                "at": utc_now()}
    # The server did not come up, or died: its own log is the evidence.
    return {"arm": arm, "stage": "speed", "what": f"{start} server start", "kind": failures.DEAD, "status": None,
            "request": None, "error": str(exc).split("\n")[0], "error_body": None,
            "log_tail": tail_lines(server_log, 40), "at": utc_now()}


def _confirm_failure(exc: BaseException, spec: dict, receipt: dict, *, cfg: Mapping[str, Any], server_log: str,
                     starts_log: str | None) -> dict:
    """The failed start's work once more on a fresh start of the same server (stored beside the first failure)."""
    conf: dict = {"at": utc_now(), "kind": None, "status": None, "error": None, "error_body": None}
    try:
        with launch.Server(spec, log_path=server_log, receipt=receipt, timeout_s=cfg["request_timeout_s"]) as srv:
            launch.log_start_event(starts_log, event="ready", phase="speed-confirm", spec=spec, receipt=receipt,
                                   facts=srv.facts())
            bodies = exc.requests if isinstance(exc, BracketFailure) else []
            bad = [s for s in (send_together(srv.endpoint, bodies, timeout_s=cfg["request_timeout_s"])
                               if bodies else []) if s.get("error") is not None]
            alive = srv.proc is None or srv.proc.poll() is None
            if bad or not alive:
                first = bad[0] if bad else {}
                conf.update(kind=failures.classify(first.get("status"), server_alive=alive),
                            status=first.get("status"), error=first.get("error") or "the server process exited",
                            error_body=first.get("body"))
            else:
                conf.update(kind="answered", status=200)
            conf["log_tail"] = srv.log_tail(40)
    except ServerError as err:
        conf.update(kind=failures.DEAD, error=str(err).split("\n")[0], log_tail=str(err)[-4000:])
    log.warning("speed: confirmation on a fresh start: %s", conf["kind"])
    return conf


def _failed_bracket(exc: BaseException, *, start: str, arm: str, rec: dict, starts: list, records: list,
                    specs: Mapping[str, dict], receipts: Mapping[str, dict], cfg: Mapping[str, Any], audit: str,
                    out_path: str, streams_path: str, server_logs: Mapping[str, str], starts_log: str | None,
                    inputs: Sequence[str]) -> dict:
    """decision.json for a bracket a server broke: the failure (and its confirmation), what was measured before."""
    failure = _start_failure(exc, start=start, arm=arm, server_log=server_logs[start])
    log.warning("speed %s (%s arm) failed: %s", start, arm, failures.summary(failure))
    if arm == "candidate" and failures.is_server_failure(failure["kind"]):
        failure["confirmation"] = _confirm_failure(exc, specs[arm], receipts[arm], cfg=cfg,
                                                   server_log=f"{server_logs[start]}.confirm",
                                                   starts_log=starts_log)
    rec.update(stopped_at=utc_now(), failure=failure)
    why = f"the {arm} server failed at {failure['what']}: {failures.summary(failure)}"
    prov = artifacts.provenance(inputs, {"speed": cfg})
    artifacts.write_jsonl(streams_path, {"schema": STREAMS_SCHEMA, "audit": audit, "provenance": prov}, records)
    doc = {"schema": SCHEMA, "audit": audit, "not_run": why, "failure": failure, "starts": [*starts, rec],
           "params": cfg, "provenance": prov, "streams": str(streams_path),
           "gate": {"rule": cfg["rule"], "verdict": "INCONCLUSIVE",
                    "reasons": [f"not measured: {why} (the servers gate decides what the failure means)"]}}
    artifacts.write_json(out_path, doc)
    return doc


def _decided_bracket(*, cfg: Mapping[str, Any], audit: str, starts: list, results: dict, records: list,
                     prompts: Mapping[str, Any], hashes: Mapping[str, str], prior_spread: Mapping[str, Any],
                     archive_path: str, appended: int, inputs: Sequence[str], out_path: str,
                     streams_path: str) -> dict:
    hosts = sorted({s["host"] for s in starts})
    clock = clock_check([s["clock"] for s in starts], cfg["expected_clock_cap"],
                        after=[s["clock_after"] for s in starts], starts=[s["start"] for s in starts])
    if len(hosts) > 1:  # cannot happen in one process; kept so a future split cannot pass silently
        clock["mismatch"].append("host")
        clock["verdict"] = "DIFFERENT"
    now = read_archive(archive_path)
    spread = {}
    for c in cfg["cells"]:
        name = c["name"]
        pooled = {st: results[st][name]["pooled"] for st, _, _ in START_ROLES}
        win_spread = []
        for r in range(cfg["repeats"]):
            a, b = pooled["s1"][r][cfg["primary"]], pooled["s3"][r][cfg["primary"]]
            win_spread.append(100.0 * abs(a - b) / abs((a + b) / 2) if a is not None and b is not None and a + b
                              else None)
        incl = archive_spread(now, name, hashes[name], cfg["primary"])
        spread[name] = {"metric": cfg["primary"], "win_pct": cfg["win_pct"], "window_pct": win_spread,
                        "window_max_pct": max((x for x in win_spread if x is not None), default=None),
                        "archive_pct": prior_spread[name]["range_pct"], "archive_n": prior_spread[name]["n"],
                        "archive_cv_pct": prior_spread[name]["cv_pct"],
                        "archive_with_window_pct": incl["range_pct"], "archive_with_window_n": incl["n"],
                        "config_hash": hashes[name]}
    win2, series, gate = decide(results, cfg, clock, {n: s["archive_with_window_pct"] for n, s in spread.items()})
    prov = artifacts.provenance(inputs, {"speed": cfg})
    artifacts.write_jsonl(streams_path, {"schema": STREAMS_SCHEMA, "audit": audit, "provenance": prov}, records)
    doc = _clean({
        "schema": SCHEMA, "audit": audit, "gate": gate, "win2": win2,
        "bar": {"win_pct": cfg["win_pct"], "primary": cfg["primary"], "guards": cfg["guards"],
                "reported": cfg["reported"], "lower_is_better": sorted(LOWER_IS_BETTER)},
        "starts": starts, "hosts": hosts, "clock_check": clock,
        "cells": [{**c, "prompt_tokens": len(prompts[c["name"]][(0, 0, 0)])} for c in cfg["cells"]],
        "pooled": {c["name"]: {st: results[st][c["name"]]["pooled"] for st, _, _ in START_ROLES}
                   for c in cfg["cells"]},
        "series": series,
        "deviations": gate["stage_deviations"],
        "bench_serve": {c["name"]: {st: results[st][c["name"]]["bench_serve"] for st, _, _ in START_ROLES}
                        for c in cfg["cells"]},
        "spread": spread,
        "archive": {"path": str(archive_path), "appended": appended},
        "streams": str(streams_path),
        "params": cfg, "provenance": prov,
    })
    artifacts.write_json(out_path, doc)
    log.info("speed verdict %s: %s", gate["verdict"], "; ".join(gate["reasons"][:len(cfg["cells"])]))
    return doc
