"""Clock facts of a speed start and their check across the bracket.

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
import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from pairaudit.core.artifacts import utc_now

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
    return {"time": utc_now("milliseconds"), "cpu_mhz": float(np.mean(mhz)) if mhz else None,
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


# -------------------------------------------------------------------- stage

def host_facts() -> dict:
    return {"host": socket.gethostname(), "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "slurmd_nodename": os.environ.get("SLURMD_NODENAME")}
