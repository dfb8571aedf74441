"""Clock facts of a speed start and their check across the bracket.

Clock facts per start (``clock_facts``): cpu_mhz (mean of /proc/cpuinfo),
governor, scaling_max_freq_khz, scaling_min_freq_khz (cpu0 cpufreq, null
when absent), loadavg [1, 5, 15], and when ``nvidia-smi`` exists ``gpu``: a
reading of the GPUs the arm's server uses (:mod:`pairaudit.speed.gpu`: only
those its CUDA_VISIBLE_DEVICES names, every GPU when it names none) with per
GPU the SM clocks, power limits, the active event reasons and the cumulative
event-reason counters. Each start is read before its server starts and after
its last wave (``clock_check``):

- the *cap* facts (governor, scaling_max_freq_khz, GPU count, per GPU
  clocks.max.sm, clocks.applications.graphics, power.limit,
  enforced.power.limit, and locked clocks where the driver has a field for
  them) must be equal across the three starts, equal to
  ``speed.expected_clock_cap`` where set, and unchanged within each start;
- a GPU slowdown inside a start (SW/HW thermal or HW power-brake counter
  grew, with its microseconds; HW slowdown or another reason that is not
  idle, application clocks, SW power cap or sync boost seen active) is
  DIFFERENT; SW power cap and sync boost at an unchanged power limit are
  recorded with their microseconds (``power_cap``), never refused;
- otherwise a start without clock facts (no cpufreq and no GPU facts:
  typical of a VM; a failing nvidia-smi) is UNVERIFIABLE, which makes the
  gate INCONCLUSIVE ("clock unverifiable") unless ``speed.
  accept_unverifiable_clock: true``, then listed as a deviation.

CPU MHz, load average, GPU SM clock, power draw and temperature are recorded,
not decisive.  So is the host's CPU share over each measured wave
(``host_cpu_share``: busy, steal and iowait percent of all cores, from
/proc/stat), kept in the stream records: on a virtual machine, whose clock
and neighbours are invisible from inside, time stolen by the hypervisor is
the one trace of a neighbour that slowed a repeat.
"""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from pairaudit.core.artifacts import utc_now
from pairaudit.core.settings import SpeedSettings
from pairaudit.speed.gpu import GPU_CAP_FIELDS, gpu_cap_facts, read_gpus, start_findings

# ------------------------------------------------------------- clock facts

CAP_KEYS = ("governor", "scaling_max_freq_khz")
_GPU_KEY = re.compile(r"gpu\d+\.")


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def clock_facts(visible_devices: str | None = None, *, exe: str | None = None) -> dict:
    """What the clocks were at one start: recorded per start, the cap facts compared across starts.

    ``visible_devices``: the CUDA_VISIBLE_DEVICES the server runs with
    (``gpu.server_visible_devices``); None reads every GPU.
    """
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
            "loadavg": load, "cpu_count": os.cpu_count(), "gpu": read_gpus(visible_devices, exe=exe)}


def _gpu_failed(facts: Mapping[str, Any]) -> bool:
    return bool((facts.get("gpu") or {}).get("error"))


def cap_facts(facts: Mapping[str, Any]) -> dict:
    """The facts that must be equal across the bracket's starts (load and current MHz are not).

    A reading whose GPU query failed has no GPU keys (it is a gap, ``clock_gaps``).
    """
    cap = {k: facts.get(k) for k in CAP_KEYS}
    gpu = facts.get("gpu")
    if gpu and not gpu.get("error"):
        cap["gpu_count"] = len(gpu.get("gpus") or [])
        cap.update(gpu_cap_facts(gpu.get("gpus")))
    return cap


def expected_cap_errors(expected: Any) -> list[str]:
    """Why a ``speed.expected_clock_cap`` mapping is not one of cap facts ([] when it is)."""
    if expected is None:
        return []
    if not isinstance(expected, dict):
        return [f"must be a mapping of cap fact -> value, or null (got {type(expected).__name__})"]
    allowed = f"{', '.join(CAP_KEYS)}, gpu_count, gpu<i>.<field> with field one of {', '.join(GPU_CAP_FIELDS)}"
    return [f"{k!r} is not a cap fact (allowed: {allowed}, or a locked-clock field the driver reports)"
            for k in expected if not (k in CAP_KEYS or k == "gpu_count" or (
                isinstance(k, str) and _GPU_KEY.match(k) and (k.split(".", 1)[1] in GPU_CAP_FIELDS
                                                               or "locked" in k)))]


def _canon(v: Any) -> str:
    """One spelling per value: 700, 700.0 and "700.00" are the same power limit."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return repr(float(v))
    if isinstance(v, str):
        try:
            return repr(float(v))
        except ValueError:
            return json.dumps(v)
    return json.dumps(v, sort_keys=True)


def clock_gaps(facts: Mapping[str, Any]) -> list[str]:
    """Why one reading cannot vouch for the clocks ([] when it can).

    A reading vouches when it has a CPU cap fact (cpufreq governor or max
    frequency) or GPU facts of at least one GPU, and its GPU query did not
    fail. A VM without cpufreq and without nvidia-smi has none: its clocks are
    unverifiable.
    """
    gaps = []
    gpu = facts.get("gpu") or {}
    if gpu.get("error"):
        gaps.append(f"gpu: {gpu['error']}")
    cpu = facts.get("governor") is not None or facts.get("scaling_max_freq_khz") is not None
    if not cpu and not gpu.get("gpus") and not gpu.get("error"):
        why = "no nvidia-smi" if not gpu else "no GPU visible to the server"
        gaps.append(f"no cpufreq governor or max frequency and no GPU facts ({why})")
    return gaps


def clock_check(facts_per_start: Sequence[Mapping[str, Any]], expected: Mapping[str, Any] | None = None,
                after: Sequence[Mapping[str, Any]] | None = None,
                starts: Sequence[str] = ("s1", "s2", "s3")) -> dict:
    """Cap facts across the starts, and within each start (before it vs after its last wave); GPU slowdowns.

    verdict: DIFFERENT when the starts' cap facts differ, differ from
    ``expected``, a start's cap facts after its work differ from those
    before it, or a GPU slowed down inside a start (``slowdowns``, see
    gpu.start_findings); else UNVERIFIABLE when some reading has no
    clock facts (``clock_gaps``) or a start's slowdowns cannot be judged (a
    counter reset); else OK. ``power_cap`` records each start's SW power cap
    and sync boost microseconds per GPU; ``notes`` what the driver could not
    report (locked clocks, counters) and how GPUs were selected.
    """
    after = list(after) if after is not None else None
    caps = [cap_facts(f) for f in facts_per_start]
    caps_after = [cap_facts(f) for f in after] if after is not None else []
    keys = sorted(set().union(*caps)) if caps else []
    # a key absent from a start is a failed GPU query there: that start is unverifiable, not different
    mismatch = [k for k in keys if len({_canon(c[k]) for c in caps if k in c}) > 1]
    off = sorted(k for k, v in (expected or {}).items()
                 if any(_canon(c.get(k)) != _canon(v) for c, f in zip(caps, facts_per_start)
                        if not ((_GPU_KEY.match(k) or k == "gpu_count") and _gpu_failed(f))))
    within = []
    for name, b, a in zip(starts, caps, caps_after):
        changed = sorted(k for k in set(b) & set(a) if _canon(b[k]) != _canon(a[k]))
        if changed:
            within.append({"start": name, "changed": changed,
                           "before": {k: b.get(k) for k in changed}, "after": {k: a.get(k) for k in changed}})
    unverifiable, slowdowns, power_cap, notes, gpu_ids = [], [], [], [], {}
    for name, f, fa in zip(starts, facts_per_start, after if after is not None else [None] * len(caps)):
        gaps = clock_gaps(f) + ([] if fa is None else [f"after: {g}" for g in clock_gaps(fa)])
        gpu = f.get("gpu")
        if gpu:
            gpu_ids[name] = [g.get("uuid") for g in gpu.get("gpus") or []]
            notes += [*gpu.get("notes", []), *(f"{k}: {v}" for k, v in gpu.get("not_reported", {}).items())]
        if fa is not None:
            found = start_findings(name, gpu, fa.get("gpu"))
            slowdowns += found["slowdowns"]
            power_cap += found["power_cap"]
            gaps += found["gaps"]
            notes += found["notes"]
        if gaps:
            unverifiable.append({"start": name, "gaps": gaps})
    if len({json.dumps(v) for v in gpu_ids.values()}) > 1:
        notes.append(f"the starts ran on different GPUs: {gpu_ids}")
    if mismatch or off or within or slowdowns:
        verdict = "DIFFERENT"
    elif unverifiable:
        verdict = "UNVERIFIABLE"
    else:
        verdict = "OK"
    return {"cap_keys": keys, "caps": caps, "caps_after": caps_after, "mismatch": mismatch,
            "expected": dict(expected or {}), "off_expected": off, "within_start": within,
            "slowdowns": slowdowns, "power_cap": power_cap, "gpu_ids": gpu_ids,
            "notes": list(dict.fromkeys(notes)), "unverifiable": unverifiable, "verdict": verdict}


def clock_findings(clock: Mapping[str, Any], speed: SpeedSettings) -> tuple[list[str], list[dict]]:
    """(reasons that make the gate INCONCLUSIVE, deviations) from a clock_check.

    Every condition the rule itself does not see is here, so win2-v1 and
    win2-v2 are held to the same clocks.
    """
    incon, devs = [], []
    for k in clock.get("off_expected") or []:
        incon.append(f"clock cap fact {k} differs from speed.expected_clock_cap ({clock['expected'].get(k)!r}): "
                     f"before each start {[c.get(k) for c in clock.get('caps') or []]}")
    for w in clock.get("within_start") or []:
        incon.append(f"{w['start']}: clock facts changed during the start ({', '.join(w['changed'])}: "
                     f"before {w['before']}, after {w['after']})")
    for sd in clock.get("slowdowns") or []:
        incon.append(f"{sd['start']}: GPU slowdown inside the start: {sd['detail']}")
    unv = clock.get("unverifiable") or []
    if unv:
        what = "; ".join(f"{u['start']}: {', '.join(u['gaps'])}" for u in unv)
        if speed.accept_unverifiable_clock:
            devs.append({"gate": "speed", "what": "accept_unverifiable_clock",
                         "detail": f"clock unverifiable, accepted by speed.accept_unverifiable_clock ({what}): "
                                   "a start may have run at another clock than the others"})
        else:
            incon.append(f"clock unverifiable ({what}); speed.accept_unverifiable_clock: true accepts this "
                         "as a reported deviation")
    return incon, devs


# ------------------------------------------------------------ host CPU share

# /proc/stat's aggregate "cpu" line: user nice system idle iowait irq softirq steal (guest time is in user)
_STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def host_cpu_times(path: str = "/proc/stat") -> tuple[int, ...] | None:
    """The host's cumulative CPU time counters (jiffies), or None where /proc/stat cannot be read."""
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                if line.startswith("cpu "):
                    vals = [int(v) for v in line.split()[1:1 + len(_STAT_FIELDS)]]
                    return tuple(vals + [0] * (len(_STAT_FIELDS) - len(vals)))
    except (OSError, ValueError):
        return None
    return None


def host_cpu_share(before: tuple[int, ...] | None, after: tuple[int, ...] | None) -> dict | None:
    """Busy, steal and iowait as percent of all cores' time between two readings; None when unknown.

    Busy is user + nice + system + irq + softirq; steal is time the hypervisor
    gave another guest while this one wanted the core.
    """
    if before is None or after is None:
        return None
    d = dict(zip(_STAT_FIELDS, (a - b for a, b in zip(after, before))))
    total = sum(d.values())
    if total <= 0:
        return None
    busy = d["user"] + d["nice"] + d["system"] + d["irq"] + d["softirq"]
    return {"busy_pct": round(100.0 * busy / total, 2), "steal_pct": round(100.0 * d["steal"] / total, 2),
            "iowait_pct": round(100.0 * d["iowait"] / total, 2)}


# -------------------------------------------------------------------- stage

def host_facts() -> dict:
    return {"host": socket.gethostname(), "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "slurmd_nodename": os.environ.get("SLURMD_NODENAME")}
