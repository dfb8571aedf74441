"""GPU clock facts of a speed start, read with ``nvidia-smi``, and what they say about the start.

Which GPUs: only those the arm's server uses. ``server_visible_devices``
gives the ``CUDA_VISIBLE_DEVICES`` of the environment a launched server gets
(the job's environment overlaid with the arm's ``env``); an attached server
was started by someone else, so its GPUs are unknown and every GPU of the
host is read, as when the variable is unset. The entries (indices or
``GPU-`` UUIDs, a unique UUID prefix too) are resolved the way CUDA does it
against ``nvidia-smi --query-gpu=index,uuid,name`` and read with
``--id=<uuid>,...``: the first entry that names no GPU ends the list (CUDA
ignores it and every entry after it), an empty value means no GPU.
``gpu{i}`` in the facts is the server's device ``i`` (the order of the
variable), not nvidia-smi's index.

One reading (``read_gpus``, a ``GpuQuery``) holds per GPU (a ``GpuReading``)
the current, max and application SM clocks, power.limit and
enforced.power.limit, power draw, temperature, the active event-reason
bitmask decoded, and the cumulative event-reason counters in microseconds
(``clocks_event_reasons_counters.*``: SW power cap, sync boost, SW thermal,
HW thermal and HW power-brake slowdown; the driver keeps no counter for the
generic HW slowdown). Field names are tried current first
(``clocks_event_reasons.*``); when nvidia-smi answers that a field "is not a
valid field to query" the deprecated ``clocks_throttle_reasons.*`` are used,
and an unknown counter is recorded as not reported. Locked clocks are read
where the driver lists a query field for them (``--help-query-gpu``; driver
580 lists none, which is recorded, not failed). Any other failure names the
field and the driver version as the reading's ``error``.

What a start's two readings (before it, after its last wave) say
(``start_findings``):

- a slowdown counter (SW thermal, HW thermal, HW power brake) that grew
  inside the start is a slowdown, with its microseconds;
- a reason seen active in either reading that is not idle, application
  clocks, SW power cap or sync boost is a slowdown too (the only evidence for
  HW slowdown and display clock, and for every reason where the counters are
  unavailable: the check then rests on the two instants and says so);
- SW power cap and sync boost are what a working GPU at its power limit
  shows: their microseconds are recorded, never refused (a moved power limit
  is a cap fact and is compared on its own).
"""

from __future__ import annotations

import csv
import functools
import io
import os
import re
import shutil
import subprocess
from typing import Any, Literal, Mapping, Sequence, TypedDict

from pairaudit.serving.armspec import ArmSpec

# nvml.h clocksEventReasons bits (the same under the deprecated clocksThrottleReasons names).
EVENT_BITS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
              0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
              0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting"}
# What a working GPU shows: idle between loads, held at its application clocks, held under its power
# limit by the SW power cap (normal for any loaded H200 at 700 W), or kept in step with its sync group.
EXPECTED_REASONS = ("gpu_idle", "applications_clocks_setting", "sw_power_cap", "sync_boost")
CAP_COUNTERS = ("sw_power_cap", "sync_boost")                       # recorded with their microseconds
SLOWDOWN_COUNTERS = ("sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")  # refused
COUNTERS = CAP_COUNTERS + SLOWDOWN_COUNTERS

CURRENT_NAMES, DEPRECATED_NAMES = "clocks_event_reasons", "clocks_throttle_reasons"
COUNTER_PREFIX = "clocks_event_reasons_counters"
BASE_FIELDS = ("index", "uuid", "driver_version", "clocks.current.sm", "clocks.max.sm",
               "clocks.applications.graphics", "power.limit", "enforced.power.limit", "power.draw",
               "temperature.gpu")
# Compared across the starts and within each start (a GPU's own caps, not its momentary state).
GPU_CAP_FIELDS = ("clocks.max.sm", "clocks.applications.graphics", "power.limit", "enforced.power.limit")
_INT_FIELDS = {"index", "clocks.current.sm", "clocks.max.sm", "clocks.applications.graphics", "temperature.gpu"}
_FLOAT_FIELDS = {"power.limit", "enforced.power.limit", "power.draw"}
_INVALID_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')
_TIMEOUT_S = 20


class GpuReading(TypedDict):
    """One GPU at one instant (``gpu{i}`` = the server's device i). Values are null where the driver says N/A."""
    index: int | None                   # nvidia-smi's index
    uuid: str | None
    clocks: dict[str, int | None]       # {"clocks.current.sm", "clocks.max.sm", "clocks.applications.graphics"} MHz
    power: dict[str, float | None]      # {"power.limit", "enforced.power.limit", "power.draw"} W
    temperature_c: int | None
    active_mask: str | None             # the event-reason bitmask as nvidia-smi printed it
    active_reasons: list[str]           # its set bits by name (EVENT_BITS)
    counters_us: dict[str, int | None] | None   # cumulative event-reason microseconds; None: the driver has none
    locked_clocks: dict[str, str | None] | None  # {field: value} where the driver has such fields, else None


class GpuQuery(TypedDict):
    """One nvidia-smi reading of the GPUs a server uses."""
    exe: str
    driver_version: str | None
    cuda_visible_devices: str | None    # as the server gets it; None: unset or unknown (every GPU is read)
    selected: list[dict] | None         # [{entry, index, uuid}] in the server's device order; None: every GPU
    reason_fields: str                  # "clocks_event_reasons" or the deprecated "clocks_throttle_reasons"
    not_reported: dict[str, str]        # what this driver has no field for -> why (counters, locked clocks)
    notes: list[str]
    error: str | None                   # the reading failed: names the field or the exit, and the driver
    gpus: list[GpuReading]


class Slowdown(TypedDict):
    start: str
    gpu: str                            # "gpu<i>"
    uuid: str | None
    reason: str                         # an EVENT_BITS name
    us: int | None                      # microseconds inside the start (counter); None when seen in the mask
    source: Literal["counter", "active mask"]
    detail: str


class PowerCap(TypedDict):
    start: str
    gpu: str
    uuid: str | None
    power_limit_w: float | None
    sw_power_cap_us: int | None         # None: no counter (then seen_active says what the mask showed)
    sync_boost_us: int | None
    seen_active: list[str]              # of sw_power_cap / sync_boost, in either reading


class StartFindings(TypedDict):
    slowdowns: list[Slowdown]
    power_cap: list[PowerCap]
    gaps: list[str]                     # why this start's GPU slowdowns cannot be judged
    notes: list[str]                    # how the check was weakened (counters unavailable)


# ------------------------------------------------------------------ reading

def server_visible_devices(spec: ArmSpec | Mapping[str, Any], environ: Mapping[str, str] | None = None) -> str | None:
    """CUDA_VISIBLE_DEVICES of the environment the arm's server is launched with; None: not said (all GPUs).

    A launched server gets the job's environment overlaid with the arm's
    ``env`` (launch.Server); an attached one was started elsewhere, so what
    this process sees says nothing about it.
    """
    # an ArmSpec, or its to_json() record (what specs/<arm>.json holds)
    mode, arm_env = (spec.mode, spec.env) if isinstance(spec, ArmSpec) else (spec.get("mode"), spec.get("env"))
    if mode != "launch":
        return None
    env = {**(os.environ if environ is None else environ), **(arm_env or {})}
    return env.get("CUDA_VISIBLE_DEVICES")


def _smi(exe: str, args: Sequence[str]) -> tuple[int | None, str]:
    """(exit status, stdout + stderr); status None when it could not run. nvidia-smi prints errors on either."""
    try:
        res = subprocess.run([exe, *args], capture_output=True, text=True, timeout=_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    return res.returncode, (res.stdout + ("\n" + res.stderr if res.stderr.strip() else "")).strip()


def _rows(text: str, n: int) -> list[list[str]] | None:
    rows = [[v.strip() for v in r] for r in csv.reader(io.StringIO(text), skipinitialspace=True) if r]
    return rows if all(len(r) == n for r in rows) else None


def driver_version(exe: str) -> str:
    rc, out = _smi(exe, ["--query-gpu=driver_version", "--format=csv,noheader"])
    vers = sorted({line.strip() for line in out.splitlines() if line.strip()}) if rc == 0 else []
    return ", ".join(vers) if vers else f"unknown (nvidia-smi --query-gpu=driver_version: {out[:120]!r})"


@functools.lru_cache(maxsize=8)
def locked_clock_fields(exe: str) -> tuple[str, ...] | None:
    """The query fields this driver lists for locked clocks (none on 580); None when the list cannot be read."""
    rc, out = _smi(exe, ["--help-query-gpu"])
    if rc != 0:
        return None
    names = re.findall(r'^"([^"]+)"', out, flags=re.M)
    return tuple(n for n in names if "locked" in n)


def select_visible(value: str, table: Sequence[Mapping[str, Any]]) -> tuple[list[dict], list[str]]:
    """The GPUs a CUDA_VISIBLE_DEVICES value gives a process, in its device order, and notes.

    Resolved as CUDA does (seen on an H200 with CUDA 13): entries are indices
    or ``GPU-`` UUIDs (a unique prefix is enough), surrounding blanks are
    ignored, and the first entry that names no GPU ends the list ("0,7" on a
    one-GPU host is GPU 0; "7,0", "" and "-1" are none).
    """
    sel: list[dict] = []
    notes: list[str] = []
    if not value.strip():
        return [], ["CUDA_VISIBLE_DEVICES is empty: the server sees no GPU"]
    known = ", ".join(f"{t['index']} {t['uuid']}" for t in table)
    for raw in value.split(","):
        e = raw.strip()
        hits = []
        if e.isdigit():
            hits = [t for t in table if t["index"] == int(e)]
        elif e.startswith("GPU-"):
            hits = [t for t in table if str(t["uuid"]).startswith(e)]
        elif e.startswith("MIG-"):
            notes.append(f"CUDA_VISIBLE_DEVICES entry {e!r} is a MIG instance: its GPU is not resolved here, "
                         "so this entry and those after it are not read")
            break
        if len(hits) != 1:
            why = "matches more than one GPU" if hits else "matches no GPU"
            notes.append(f"CUDA_VISIBLE_DEVICES entry {e!r} {why} of this host ({known}): CUDA ignores it and "
                         "every entry after it")
            break
        t = hits[0]
        if any(s["uuid"] == t["uuid"] for s in sel):
            notes.append(f"CUDA_VISIBLE_DEVICES entry {e!r} repeats GPU {t['index']}: read once")
            continue
        sel.append({"entry": e, "index": t["index"], "uuid": t["uuid"]})
    if len({t.get("name") for t in table}) > 1 and any(s["entry"].isdigit() for s in sel):
        notes.append("this host mixes GPU models and CUDA numbers devices fastest first unless "
                     "CUDA_DEVICE_ORDER=PCI_BUS_ID: an index may name another GPU than nvidia-smi's; name GPUs "
                     "by UUID to be sure")
    return sel, notes


def _gpu_table(exe: str) -> tuple[list[dict] | None, str | None]:
    rc, out = _smi(exe, ["--query-gpu=index,uuid,name", "--format=csv,noheader"])
    rows = _rows(out, 3) if rc == 0 else None
    if rows is None:
        return None, f"nvidia-smi --query-gpu=index,uuid,name: exit {rc}: {out[:200]!r}"
    return [{"index": int(r[0]), "uuid": r[1], "name": r[2]} for r in rows], None


def _value(v: str, kind: type | None) -> Any:
    # "[N/A]", "N/A", "[Not Supported]", "[Unknown Error]": the driver has no value
    if v == "" or v.startswith("[") or v.upper() == "N/A":
        return None
    if kind is None:
        return v
    try:
        return kind(v)
    except ValueError:
        try:
            return kind(float(v))  # "1980.0" where an integer was expected
        except ValueError:
            return None


def _reading(row: Mapping[str, str], names: str, counters: Sequence[str], locked: Sequence[str] | None,
             ) -> GpuReading:
    mask_s = _value(row[f"{names}.active"], None)
    try:
        mask = int(mask_s, 16) if mask_s is not None else None
    except ValueError:
        mask = None
    return {
        "index": _value(row["index"], int), "uuid": _value(row["uuid"], None),
        "clocks": {f: _value(row[f], int) for f in ("clocks.current.sm", "clocks.max.sm",
                                                    "clocks.applications.graphics")},
        "power": {f: _value(row[f], float) for f in ("power.limit", "enforced.power.limit", "power.draw")},
        "temperature_c": _value(row["temperature.gpu"], int),
        "active_mask": mask_s,
        "active_reasons": [] if mask is None else [n for b, n in EVENT_BITS.items() if mask & b],
        "counters_us": ({c: _value(row[f"{COUNTER_PREFIX}.{c}"], int) for c in counters} if counters else None),
        "locked_clocks": {f: _value(row[f], None) for f in locked} if locked else None,
    }


def read_gpus(cuda_visible_devices: str | None = None, *, exe: str | None = None) -> GpuQuery | None:
    """The GPUs a server with this CUDA_VISIBLE_DEVICES uses (None: every GPU), or None without nvidia-smi."""
    exe = exe or shutil.which("nvidia-smi")
    if not exe:
        return None
    q: GpuQuery = {"exe": exe, "driver_version": None, "cuda_visible_devices": cuda_visible_devices,
                   "selected": None, "reason_fields": CURRENT_NAMES, "not_reported": {}, "notes": [],
                   "error": None, "gpus": []}
    order: list[str] | None = None
    if cuda_visible_devices is not None:
        table, err = _gpu_table(exe)
        if err:
            q["error"], q["driver_version"] = err, driver_version(exe)
            return q
        sel, notes = select_visible(cuda_visible_devices, table or [])
        q["selected"], q["notes"] = sel, notes
        if not sel:
            return q
        order = [s["uuid"] for s in sel]
    found = locked_clock_fields(exe)
    if found is None:
        q["not_reported"]["locked clocks"] = "unknown: nvidia-smi --help-query-gpu failed"
    elif not found:
        q["not_reported"]["locked clocks"] = "this driver lists no query field for locked clocks"
    locked = list(found or ())
    names, counters = CURRENT_NAMES, list(COUNTERS)
    while True:
        fields = [*BASE_FIELDS, f"{names}.active", *(f"{COUNTER_PREFIX}.{c}" for c in counters), *locked]
        args = [f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
        rc, out = _smi(exe, args + ([f"--id={','.join(order)}"] if order else []))
        if rc == 0:
            break
        bad = _INVALID_FIELD.search(out)
        field = bad.group(1) if bad else None
        if field == f"{CURRENT_NAMES}.active" and names == CURRENT_NAMES:
            # drivers before the rename know only the deprecated names
            names = DEPRECATED_NAMES
            q["reason_fields"] = names
            q["notes"].append(f"{field} is not a valid field for this driver: read {DEPRECATED_NAMES}.active")
            continue
        if field and field.startswith(COUNTER_PREFIX + ".") and field.split(".", 1)[1] in counters:
            counters.remove(field.split(".", 1)[1])
            q["not_reported"][field] = "not a valid field for this driver"
            continue
        if field in locked:
            locked.remove(field)
            q["not_reported"][field] = "not a valid field for this driver"
            continue
        what = f"field {field!r} is not a valid field to query" if field else f"exit {rc}"
        ver = driver_version(exe)
        q["driver_version"], q["error"] = ver, f"nvidia-smi --query-gpu: {what} (driver {ver}): {out[:200]!r}"
        return q
    if not counters:
        q["notes"].append("this driver reports no event-reason counters: slowdowns inside a start are judged "
                          "from the active reasons at its two readings only")
    rows = _rows(out, len(fields))
    if rows is None:
        q["driver_version"] = driver_version(exe)
        q["error"] = f"nvidia-smi --query-gpu: {len(fields)} fields asked, the output does not have them: {out[:200]!r}"
        return q
    by_field = [dict(zip(fields, r)) for r in rows]
    q["driver_version"] = ", ".join(sorted({r["driver_version"] for r in by_field})) or None
    gpus = [_reading(r, names, counters, locked) for r in by_field]
    if order is not None:
        by_uuid = {g["uuid"]: g for g in gpus}
        missing = [u for u in order if u not in by_uuid]
        if missing:
            q["error"] = f"nvidia-smi --id={','.join(order)} did not return {missing}"
            return q
        gpus = [by_uuid[u] for u in order]  # the server's device order, not nvidia-smi's
    q["gpus"] = gpus
    return q


# ----------------------------------------------------------------- judging

def gpu_cap_facts(gpus: Sequence[Mapping[str, Any]] | None) -> dict:
    """{gpu<i>.<field>: value} of the caps every start must share (GPU_CAP_FIELDS, locked clocks where read)."""
    cap: dict[str, Any] = {}
    for i, g in enumerate(gpus or []):
        vals = {**(g.get("clocks") or {}), **(g.get("power") or {})}
        for f in GPU_CAP_FIELDS:
            cap[f"gpu{i}.{f}"] = vals.get(f)
        for f, v in (g.get("locked_clocks") or {}).items():
            cap[f"gpu{i}.{f}"] = v
    return cap


def _unexpected(g: Mapping[str, Any]) -> list[str]:
    return [r for r in g.get("active_reasons") or [] if r not in EXPECTED_REASONS]


def start_findings(start: str, before: GpuQuery | Mapping | None, after: GpuQuery | Mapping | None,
                   ) -> StartFindings:
    """Slowdowns inside one start from its two readings (module docstring), its power-cap time, and gaps."""
    out: StartFindings = {"slowdowns": [], "power_cap": [], "gaps": [], "notes": []}
    if not before or not after or before.get("error") or after.get("error"):
        return out  # a reading without GPU facts is a gap of the clock facts themselves (speedclock.clock_gaps)
    gb, ga = before.get("gpus") or [], after.get("gpus") or []
    if [g.get("uuid") for g in gb] != [g.get("uuid") for g in ga]:
        out["gaps"].append(f"the GPUs read after the start ({[g.get('uuid') for g in ga]}) are not those read "
                           f"before it ({[g.get('uuid') for g in gb]})")
        return out
    for i, (b, a) in enumerate(zip(gb, ga)):
        gpu, uuid = f"gpu{i}", a.get("uuid")
        cb, ca = b.get("counters_us") or {}, a.get("counters_us") or {}
        diffs: dict[str, int | None] = {}
        for c in COUNTERS:
            x, y = cb.get(c), ca.get(c)
            diffs[c] = None if x is None or y is None or y < x else y - x
            if diffs[c] is None and x is not None and y is not None:
                out["gaps"].append(f"{gpu}: the {c} counter went down ({x} -> {y} us): the GPU or its driver was "
                                   "reset inside the start")
        for c in SLOWDOWN_COUNTERS:
            if diffs[c]:
                # Seen in a public report of a consumer driver: SW thermal equal to SW power cap, to the microsecond.
                same = (" (equal to the SW power cap time: some drivers report one counter under both names)"
                        if diffs[c] == diffs["sw_power_cap"] else "")
                out["slowdowns"].append({
                    "start": start, "gpu": gpu, "uuid": uuid, "reason": c, "us": diffs[c], "source": "counter",
                    "detail": f"{gpu} ({uuid}): {c} for {diffs[c]} us inside the start (event-reason counter, "
                              f"after minus before: {cb[c]} -> {ca[c]}){same}"})
        unread = [c for c in SLOWDOWN_COUNTERS if cb.get(c) is None or ca.get(c) is None]
        if unread:
            out["notes"].append(f"{start} {gpu}: no event-reason counter for {', '.join(unread)}: judged from "
                                "the active reasons at the two readings only")
        for when, g in (("before", b), ("after", a)):
            for r in _unexpected(g):
                if r in SLOWDOWN_COUNTERS and diffs.get(r) is not None:
                    continue  # its counter above measured it over the whole start
                out["slowdowns"].append({
                    "start": start, "gpu": gpu, "uuid": uuid, "reason": r, "us": None, "source": "active mask",
                    "detail": f"{gpu} ({uuid}): {r} active {when} the start (event-reason mask "
                              f"{g.get('active_mask')})"})
        seen = sorted({r for g in (b, a) for r in g.get("active_reasons") or [] if r in CAP_COUNTERS})
        out["power_cap"].append({"start": start, "gpu": gpu, "uuid": uuid,
                                 "power_limit_w": (a.get("power") or {}).get("power.limit"),
                                 "sw_power_cap_us": diffs["sw_power_cap"], "sync_boost_us": diffs["sync_boost"],
                                 "seen_active": seen})
    return out
