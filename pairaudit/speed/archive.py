"""The control archive: every finished control start of every audit, for the window's spread.

``results/control-archive.jsonl`` (outside any audit dir, append-only):
one line per finished control start and cell: {schema:
pairaudit.control_archive/v1, audit, window (one bracket run: the control
starts of one window are what :mod:`pairaudit.speed.evidence` reads the
host's start-to-start noise from), time, start, cell, config_hash
(sha256 of the cell, output_len, waves, repeats, repeat_s, sampling and the
control arm's identity fields), plan_hash (sha256 of the wave plan the
window's first start realised), metrics
{metric: mean over repeats}, per_repeat {metric: [..]}, clock, host}.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from pairaudit.core import artifacts
from pairaudit.core.artifacts import utc_now
from pairaudit.core.contracts import CONTROL_ARCHIVE_SCHEMA
from pairaudit.core.jsonlog import append_record
from pairaudit.core.settings import SpeedCell, SpeedSettings
from pairaudit.serving.armspec import ArmSpec
from pairaudit.speed.metrics import METRICS, finite_json, spread_stats

# ------------------------------------------------------------------ archive

def config_hash(cell: SpeedCell, speed: SpeedSettings, control_spec: ArmSpec) -> str:
    """Which archived control starts are comparable: same cell, request shape and control server."""
    return artifacts.sha256_json({"cell": cell.to_json(), "output_len": speed.output_len, "waves": speed.waves,
                                  "repeats": speed.repeats,
                                  **({"repeat_s": speed.repeat_s} if speed.repeat_s is not None else {}),
                                 "sampling": {"temperature": 1.0, "top_p": 1.0, "ignore_eos": True},
                                 "control": control_spec.identity()})

log = logging.getLogger("pairaudit")


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
        if rec.get("schema") == CONTROL_ARCHIVE_SCHEMA:
            out.append(rec)
    return out


def append_archive(path: str | os.PathLike, records: Iterable[Mapping[str, Any]]) -> int:
    """Append one line per record, fsynced; never rewritten."""
    n = 0
    for rec in records:
        append_record(path, finite_json({"schema": CONTROL_ARCHIVE_SCHEMA, **rec}))
        n += 1
    return n


def archive_spread(records: Sequence[Mapping[str, Any]], cell: str, chash: str, metric: str) -> dict:
    vals = [r["metrics"].get(metric) for r in records if r.get("cell") == cell and r.get("config_hash") == chash]
    return spread_stats(vals)


def plan_hash(plan: Mapping[str, Any] | None) -> str | None:
    """Which windows measured the same waves: the sha256 of the wave plan a bracket's first start realised."""
    return None if plan is None else artifacts.sha256_json(dict(plan))


def archive_line(*, audit: str, start: str, cell: SpeedCell, chash: str, pooled: Sequence[Mapping],
                  clock: Mapping, host: str, window: str | None = None, plan_hash: str | None = None) -> dict:
    per_repeat = {m: [p[m] for p in pooled] for m in METRICS}
    means = {m: (float(np.mean(v)) if all(x is not None for x in v) else None) for m, v in per_repeat.items()}
    return {"audit": audit, "window": window, "time": utc_now("milliseconds"), "start": start, "cell": cell.name,
            "config_hash": chash, "plan_hash": plan_hash, "metrics": means, "per_repeat": per_repeat, "clock": dict(clock), "host": host}
