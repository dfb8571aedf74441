"""The host's own evidence on its start-to-start noise: earlier windows of the same control in the control archive.

Every finished control start is archived (:mod:`pairaudit.speed.archive`)
with the window (one bracket run) it belongs to. Within one window, the
control starts ran the same server on the same prompts, so the dispersion of
their values (each start's mean over repeats, on the gate's log scale:
100 ln of the value) is a sample of the start-to-start noise of this control on this host,
with (control starts - 1) degrees of freedom. A/A calibrations add their
control starts the same way, so calibrating a host is what teaches the gate
its noise. Windows are pooled by summing squares and degrees of freedom.

Only lines with the same host and, per cell, the same config hash (cell,
request shape, repeats, the control server's identity) count; lines archived
before windows were recorded (no ``window``) cannot be grouped and are left
out. Of those, a window counts only if it ran the same wave plan as this one
(``plan_hash``) and is younger than ``speed.evidence_max_age_h``; and the
windows must agree with each other: newest first, a window whose noise
differs from the newer ones' (Bartlett's test of equal variances) is left out,
so a host that got noisier is not averaged with its quiet past. Every window
left out is listed with why.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections import defaultdict
from typing import Any, Mapping, Sequence

import numpy as np

# The level at which Bartlett's test finds a window's noise unlike the newer windows' (then left out).
HETEROGENEITY_ALPHA = 0.05


def _window_var(values: Sequence[float | None]) -> tuple[float, int] | None:
    v = np.asarray([x for x in values if x is not None], dtype=float)
    if len(v) < 2 or not np.isfinite(v).all() or (v <= 0).any():
        return None
    rel = 100.0 * np.log(v)  # the gate's log scale (gates.speed._v3_start_values)
    return float(((rel - rel.mean()) ** 2).sum()), len(v) - 1


def bartlett_p(parts: Sequence[tuple[float, int]]) -> float:
    """Bartlett's test that variances (sum of squares, df) are equal: its p-value (1.0 for fewer than two)."""
    from scipy.stats import chi2

    parts = [(ss, df) for ss, df in parts if df > 0 and ss > 0]
    k = len(parts)
    if k < 2:
        return 1.0
    n = sum(df for _, df in parts)
    pooled = sum(ss for ss, _ in parts) / n
    m = n * math.log(pooled) - sum(df * math.log(ss / df) for ss, df in parts)
    c = 1.0 + (sum(1.0 / df for _, df in parts) - 1.0 / n) / (3.0 * (k - 1))
    return float(chi2.sf(m / c, k - 1))


def _age_h(stamp: Any, now: _dt.datetime) -> float | None:
    try:
        t = _dt.datetime.fromisoformat(str(stamp))
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=_dt.timezone.utc)
    return (now - t).total_seconds() / 3600.0


def _pooled_window(per_cell: Mapping[str, Mapping[str, Mapping[str, Any]]], deciding: Sequence[str],
                   m: str) -> tuple[float, int] | None:
    """(sum of squares, df) of one window's start values pooled over the deciding cells, or None."""
    common = sorted(set.intersection(*(set(per_cell.get(c, {})) for c in deciding))) if deciding else []
    rows = []
    for s in common:
        vals = [per_cell[c][s].get(m) for c in deciding]
        if any(v is None for v in vals):
            return None
        rows.append(vals)
    if len(rows) < 2:
        return None
    a = np.asarray(rows, dtype=float)                       # (starts, cells)
    if not (a > 0).all():
        return None
    rel = (100.0 * np.log(a)).mean(axis=1)
    return float(((rel - rel.mean()) ** 2).sum()), len(rel) - 1


def host_evidence(records: Sequence[Mapping[str, Any]], *, host: str, hashes: Mapping[str, str],
                  deciding: Sequence[str], metrics: Sequence[str], exclude_window: str | None,
                  plan: str | None = None, max_age_h: float | None = None,
                  now: _dt.datetime | None = None) -> dict | None:
    """metric -> {"pooled": {var, df, windows} or None, "cells": {cell: {var, df}}, "windows_used": [...],
    "left_out": [{window, why}]}, or None when no window of this control on this host was archived.

    A metric that is 0 or missing in a start (accepted drafts without speculation) gives no evidence.
    ``pooled`` is over the deciding cells (a start's value is its mean over them, as the gate pools
    them); ``cells`` per cell, for the per-cell loss tests, from the same windows. ``plan``: this window's
    wave plan hash (None: not checked); ``max_age_h``: the oldest window that counts (None: any age).
    """
    now = now or _dt.datetime.now(_dt.timezone.utc)
    windows: dict[str, dict[str, dict[str, Mapping[str, Any]]]] = defaultdict(lambda: defaultdict(dict))
    stamps: dict[str, str] = {}
    plans: dict[str, set] = defaultdict(set)
    for r in records:
        w, cell = str(r.get("window") or ""), str(r.get("cell") or "")
        if (not w or w == exclude_window or r.get("host") != host or cell not in hashes
                or r.get("config_hash") != hashes[cell]):
            continue
        windows[w][cell][str(r.get("start"))] = r.get("metrics") or {}
        stamps[w] = max(stamps.get(w, ""), str(r.get("time") or ""))
        plans[w].add(r.get("plan_hash"))
    if not windows:
        return None
    left_out: list[dict[str, str]] = []
    kept = []
    for w in windows:
        age = _age_h(stamps.get(w), now)
        if plan is not None and plans[w] != {plan}:
            left_out.append({"window": w, "why": "archived without its wave plan" if plans[w] == {None}
                             else "another wave plan than this window's"})
        elif max_age_h is not None and (age is None or age > max_age_h):
            left_out.append({"window": w, "why": f"older than evidence_max_age_h {max_age_h:g} h"
                             + ("" if age is None else f" ({age:.1f} h)")})
        else:
            kept.append(w)
    kept.sort(key=lambda w: stamps.get(w, ""), reverse=True)   # newest first
    out: dict[str, Any] = {}
    for m in metrics:
        used: list[str] = []
        parts: list[tuple[float, int]] = []
        gone = list(left_out)
        for w in kept:
            got = _pooled_window(windows[w], deciding, m)
            if got is None:
                continue
            p = bartlett_p([*parts, got])
            if parts and p < HETEROGENEITY_ALPHA:
                gone.append({"window": w, "why": f"its start-to-start noise differs from the newer windows' "
                             f"(Bartlett p {p:.3g} < {HETEROGENEITY_ALPHA})"})
                continue
            used.append(w)
            parts.append(got)
        cell_ss: dict[str, float] = defaultdict(float)
        cell_df: dict[str, int] = defaultdict(int)
        for w in used:
            for cell, starts in windows[w].items():
                got = _window_var([starts[s].get(m) for s in sorted(starts)])
                if got is not None:
                    cell_ss[cell] += got[0]
                    cell_df[cell] += got[1]
        pooled_df = sum(df for _, df in parts)
        entry: dict[str, Any] = {
            "pooled": ({"var": sum(ss for ss, _ in parts) / pooled_df, "df": pooled_df, "windows": len(used)}
                       if pooled_df else None),
            "cells": {c: {"var": cell_ss[c] / cell_df[c], "df": cell_df[c]} for c in cell_df if cell_df[c]},
            "windows_used": used, "left_out": gone}
        out[m] = entry
    return out
