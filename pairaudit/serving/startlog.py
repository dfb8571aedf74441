"""Where a server start's seconds went, read from its own log.

A launched server's log holds one start per ``=== pairaudit launch ...``
line (written by :class:`pairaudit.serving.launch.Server` with a UTC
timestamp to the millisecond) followed by what the server printed.  vLLM
stamps its lines ``INFO MM-DD HH:MM:SS`` (whole seconds, the host's local
time), and names each step of its start in fixed words; this module finds
those steps and turns them into seconds since the launch::

    launch -> banner (imports of the API server process)
           -> engine (the engine-core process's first line)
           -> weights (the model loaded)
           -> compiled (torch.compile done, or read from its cache)
           -> kv_cache (the KV cache sized: profiled, or given in bytes)
           -> graphs (CUDA graph capture finished)
           -> engine_ready ("init engine ... took")
           -> api (the HTTP server started)
           -> healthy (the audit's first 200 on /health: ``ready_s``)

``segments`` are the differences between consecutive steps that were found
(a step vLLM did not print, such as graphs under ``--enforce-eager``, is
left out and its time falls into the next one); where capture is logged,
``graphs_s`` is vLLM's own count of capture seconds and ``warmup`` the kernel
warm-up between the KV cache and the capture.  vLLM's seconds are whole,
so every segment is good to about one second.  A server that prints none of
these lines (the reference server) gets the healthy time alone.

The breakdown goes into the ``ready`` line of ``servers/starts.jsonl``
(``launch.log_start_event``), and ``starts_table`` renders those lines.
Run as ``python -m pairaudit.serving.startlog STARTS.jsonl [LOG...]``: the
table of an audit's starts, or the breakdown of every start in each log.
"""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

LAUNCH_RE = re.compile(r"^=== pairaudit launch arm=(?P<arm>\S+) at (?P<at>\S+):")
# vLLM 0.2x-0.3x: "(APIServer pid=5587) INFO 12-06 12:34:00 [file.py:345] message"
STAMP_RE = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR)\s+(?P<md>\d\d-\d\d) (?P<hms>\d\d:\d\d:\d\d)\b")

# (step, pattern): the first line after the launch matching the pattern marks the step.  Ordered as a
# start runs; a later step's pattern is looked for only after the earlier step's line.
STEPS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("banner", re.compile(r"version \d+\.\d+|non-default args")),
    ("engine", re.compile(r"Initializing a V1 LLM engine|EngineCore pid=")),
    ("weights", re.compile(r"Model loading took|Loading weights took")),
    ("compiled", re.compile(r"torch\.compile took|Compilation .*took|Directly load the compiled graph")),
    ("kv_cache", re.compile(r"[GC]PU KV cache size|Available KV cache memory|KV Cache as specified by kv_cache_memory_bytes")),
    ("graphs", re.compile(r"Graph capturing finished")),
    ("engine_ready", re.compile(r"init engine \(profile, create kv cache, warmup model\) took")),
    ("api", re.compile(r"Starting vLLM (?:API )?server on")),
)
STEP_NAMES = tuple(name for name, _ in STEPS) + ("healthy",)

_GIB = re.compile(r"Available KV cache memory: (?P<gib>[\d.]+) GiB")
_KV_BYTES = re.compile(r"reserved (?P<gib>[\d.]+) GiB memory for KV Cache")
_KV_TOKENS = re.compile(r"[GC]PU KV cache size: (?P<tok>[\d,]+) tokens")
_GRAPH_S = re.compile(r"Graph capturing finished in (?P<s>[\d.]+) secs?")
_GRAPH_SIZES = re.compile(r"Capturing CUDA graphs \((?P<mode>[A-Z_]+)\)[^|]*\|[^|]*\| *\d+/(?P<n>\d+)")
_COMPILE_S = re.compile(r"torch\.compile took (?P<s>[\d.]+) s")
_INIT_S = re.compile(r"init engine \(profile, create kv cache, warmup model\) took (?P<s>[\d.]+) s")
_VERSION = re.compile(r"version (?P<v>\d+\.\d+\.\d+\S*)")


@dataclass(frozen=True)
class StartBreakdown:
    """One start's steps (seconds after the launch line) and what vLLM said of its KV cache and graphs."""

    launched_at: str | None
    steps: Mapping[str, float]
    segments: Mapping[str, float]
    server: str | None = None            # "vllm <version>" when the log says so
    kv_cache_gib: float | None = None
    kv_cache_tokens: int | None = None
    compile_s: float | None = None
    graphs_s: float | None = None
    graph_sizes: Mapping[str, int] = field(default_factory=dict)   # capture mode -> how many sizes
    init_engine_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"launched_at": self.launched_at, "server": self.server, "steps": dict(self.steps),
                "segments": dict(self.segments), "kv_cache_gib": self.kv_cache_gib,
                "kv_cache_tokens": self.kv_cache_tokens, "compile_s": self.compile_s, "graphs_s": self.graphs_s,
                "graph_sizes": dict(self.graph_sizes), "init_engine_s": self.init_engine_s}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "StartBreakdown":
        return cls(launched_at=doc.get("launched_at"), steps=dict(doc.get("steps") or {}),
                   segments=dict(doc.get("segments") or {}), server=doc.get("server"),
                   kv_cache_gib=doc.get("kv_cache_gib"), kv_cache_tokens=doc.get("kv_cache_tokens"),
                   compile_s=doc.get("compile_s"), graphs_s=doc.get("graphs_s"),
                   graph_sizes=dict(doc.get("graph_sizes") or {}), init_engine_s=doc.get("init_engine_s"))


def _local_offset_s() -> int:
    # the server runs on this host with this job's environment (TZ included): its log stamps are this local time
    return -time.altzone if time.localtime().tm_isdst > 0 else -time.timezone


def _stamp_s(line: str, launched: datetime, tz_offset_s: int) -> float | None:
    """Seconds from the launch to a vLLM line's stamp (its year is the launch's; a stamp a year off is wrapped)."""
    m = STAMP_RE.search(line)
    if not m:
        return None
    try:
        local = datetime.strptime(f"{launched.year}-{m['md']} {m['hms']}", "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None
    at = local.replace(tzinfo=timezone(timedelta(seconds=tz_offset_s)))
    d = (at - launched).total_seconds()
    if d < -180 * 86400:   # a start launched on 31 December, stamped in January
        d = (at.replace(year=launched.year + 1) - launched).total_seconds()
    return d


def parse_start(lines: Iterable[str], *, ready_s: float | None = None, tz_offset_s: int | None = None,
                launched_at: str | None = None) -> StartBreakdown:
    """The breakdown of the first start in ``lines`` (from its ``=== pairaudit launch`` line on).

    ``launched_at`` stands in for the launch line where ``lines`` begin after it; ``ready_s`` is the
    audit's time to healthy (``Server.facts()["ready_s"]``); ``tz_offset_s`` the offset of the server's
    log stamps from UTC (default: this process's local time, which the server inherits).
    """
    tz = _local_offset_s() if tz_offset_s is None else tz_offset_s
    launched: datetime | None = None
    if launched_at is not None:
        launched = datetime.fromisoformat(launched_at)
    steps: dict[str, float] = {}
    extra: dict[str, Any] = {"graph_sizes": {}}
    want = 0
    for raw in lines:
        line = raw.rstrip("\n")
        m = LAUNCH_RE.match(line)
        if m:
            if launched is not None and (steps or launched_at is None):
                break   # the next start of the same log
            launched = datetime.fromisoformat(m["at"])
            launched_at = m["at"]
            continue
        if launched is None:
            continue
        for pat, key, conv in ((_GIB, "kv_cache_gib", float), (_KV_BYTES, "kv_cache_gib", float),
                               (_KV_TOKENS, "kv_cache_tokens", lambda s: int(s.replace(",", ""))),
                               (_GRAPH_S, "graphs_s", float), (_COMPILE_S, "compile_s", float),
                               (_INIT_S, "init_engine_s", float)):
            hit = pat.search(line)
            if hit and extra.get(key) is None:
                extra[key] = conv(next(iter(hit.groupdict().values())))
        for g in _GRAPH_SIZES.finditer(line):
            extra["graph_sizes"][g["mode"]] = int(g["n"])
        if "server" not in extra:
            v = _VERSION.search(line)
            if v and "vLLM" in line or (v and "█" in line):
                extra["server"] = f"vllm {v['v']}"
        at = _stamp_s(line, launched, tz)
        if at is None:
            continue
        # a step may be skipped (no graphs under --enforce-eager): the first later step whose line this is
        for i in range(want, len(STEPS)):
            name, pat = STEPS[i]
            if pat.search(line):
                steps[name] = at
                want = i + 1
                break
    if ready_s is not None:
        steps["healthy"] = float(ready_s)
    return StartBreakdown(launched_at=launched_at, steps=steps, segments=segments_of(steps, extra.get("graphs_s")),
                          server=extra.get("server"), kv_cache_gib=extra.get("kv_cache_gib"),
                          kv_cache_tokens=extra.get("kv_cache_tokens"), compile_s=extra.get("compile_s"),
                          graphs_s=extra.get("graphs_s"), graph_sizes=extra["graph_sizes"],
                          init_engine_s=extra.get("init_engine_s"))


def segments_of(steps: Mapping[str, float], graphs_s: float | None = None) -> dict[str, float]:
    """Seconds between consecutive steps found, named after the step they end (``banner`` = imports).

    With the capture's own seconds known, the time from the KV cache to the end of capture is split into
    ``warmup`` (vLLM's kernel warm-up, before capture) and ``graphs``.
    """
    out: dict[str, float] = {}
    prev = 0.0
    for name in STEP_NAMES:
        if name not in steps:
            continue
        at = steps[name]
        if name == "graphs" and graphs_s is not None:
            out["warmup"] = round(max(0.0, at - prev - graphs_s), 3)
            out["graphs"] = round(min(graphs_s, max(0.0, at - prev)), 3)
        else:
            out[name] = round(at - prev, 3)
        prev = at
    return out


def read_start(log_path: str | Path, offset: int = 0, *, ready_s: float | None = None,
               tz_offset_s: int | None = None) -> StartBreakdown:
    """The breakdown of the start whose launch line is at byte ``offset`` of ``log_path``."""
    with open(log_path, "rb") as fh:
        fh.seek(offset)
        text = fh.read().decode("utf-8", "replace")
    return parse_start(text.splitlines(), ready_s=ready_s, tz_offset_s=tz_offset_s)


def read_all(log_path: str | Path, *, tz_offset_s: int | None = None) -> list[StartBreakdown]:
    """Every start of one server log, in order (the healthy time is not in the log: left out)."""
    text = Path(log_path).read_text(encoding="utf-8", errors="replace").splitlines()
    cuts = [i for i, line in enumerate(text) if LAUNCH_RE.match(line)]
    return [parse_start(text[a:b], tz_offset_s=tz_offset_s) for a, b in zip(cuts, [*cuts[1:], len(text)])]


# --------------------------------------------------------------- the table

TABLE_SEGMENTS = ("banner", "engine", "weights", "compiled", "kv_cache", "warmup", "graphs", "engine_ready",
                  "api", "healthy")
TABLE_HEAD = ("phase", "arm", "why", "healthy s", "imports", "engine proc", "weights", "compile", "KV cache",
              "warm-up", "graphs", "engine ready", "API up", "to healthy", "KV GiB")


def _f(v: Any) -> str:
    return "" if v is None else f"{v:.1f}" if isinstance(v, float) else str(v)


def starts_table(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """Markdown: one row per ``ready`` line of ``servers/starts.jsonl`` with its breakdown's segments (s)."""
    rows = ["| " + " | ".join(TABLE_HEAD) + " |", "|" + "---|" * len(TABLE_HEAD)]
    for rec in records:
        if rec.get("event") not in ("ready", "adopted"):
            continue
        bd = rec.get("breakdown") or {}
        seg = bd.get("segments") or {}
        cells = [rec.get("phase"), rec.get("arm"), rec.get("why") or "", _f(rec.get("ready_s"))]
        cells += [_f(seg.get(k)) for k in TABLE_SEGMENTS]
        cells.append(_f(bd.get("kv_cache_gib")))
        rows.append("| " + " | ".join(str(c) for c in cells) + " |")
    return rows


def read_records(starts_log: str | Path) -> list[dict[str, Any]]:
    """Every line of an audit's ``servers/starts.jsonl`` (none where it does not exist yet)."""
    path = Path(starts_log)
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def starts_markdown(starts_log: str | Path) -> list[str]:
    """The report's section: every server start of the audit, its reason and where its seconds went."""
    recs = read_records(starts_log)
    ready = [r for r in recs if r.get("event") == "ready"]
    if not ready:
        return []
    total = sum(float(r.get("ready_s") or 0.0) for r in ready)
    return ["## Server starts", "",
            f"{len(ready)} starts, {total:.0f} s to healthy in all (`{starts_log}`; seconds per step, read from "
            "each server's log; vLLM stamps whole seconds).", "", *starts_table(ready), ""]


def main(argv: Sequence[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    for path in argv:
        if path.endswith(".jsonl"):
            print("\n".join(starts_markdown(path) or [f"no server start in {path}"]))
        else:
            for bd in read_all(path):
                print(json.dumps(bd.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
