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
request shape, the control server's identity) count; lines archived before
windows were recorded (no ``window``) cannot be grouped and are left out.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Mapping, Sequence

import numpy as np


def _window_var(values: Sequence[float | None]) -> tuple[float, int] | None:
    v = np.asarray([x for x in values if x is not None], dtype=float)
    if len(v) < 2 or not np.isfinite(v).all() or (v <= 0).any():
        return None
    rel = 100.0 * np.log(v)  # the gate's log scale (gates.speed._v3_start_values)
    return float(((rel - rel.mean()) ** 2).sum()), len(v) - 1


def host_evidence(records: Sequence[Mapping[str, Any]], *, host: str, hashes: Mapping[str, str],
                  deciding: Sequence[str], metrics: Sequence[str], exclude_window: str | None) -> dict | None:
    """metric -> {"pooled": {var, df, windows}, "cells": {cell: {var, df}}}, or None with no usable window.

    A metric that is 0 or missing in a start (accepted drafts without speculation) gives no evidence.

    ``pooled`` is over the deciding cells (a start's value is its mean over them, as the gate pools
    them); ``cells`` per cell, for the per-cell loss tests.
    """
    windows: dict[str, dict[str, dict[str, Mapping[str, Any]]]] = defaultdict(lambda: defaultdict(dict))
    for r in records:
        w, cell = str(r.get("window") or ""), str(r.get("cell") or "")
        if (not w or w == exclude_window or r.get("host") != host or cell not in hashes
                or r.get("config_hash") != hashes[cell]):
            continue
        windows[w][cell][str(r.get("start"))] = r.get("metrics") or {}
    out: dict[str, Any] = {}
    for m in metrics:
        pooled_ss, pooled_df, n_windows = 0.0, 0, 0
        cell_ss: dict[str, float] = defaultdict(float)
        cell_df: dict[str, int] = defaultdict(int)
        for per_cell in windows.values():
            for cell, starts in per_cell.items():
                got = _window_var([starts[s].get(m) for s in sorted(starts)])
                if got is not None:
                    cell_ss[cell] += got[0]
                    cell_df[cell] += got[1]
            common = sorted(set.intersection(*(set(per_cell.get(c, {})) for c in deciding))) if deciding else []
            rows = []
            for s in common:
                vals = [per_cell[c][s].get(m) for c in deciding]
                if any(v is None for v in vals):
                    break
                rows.append(vals)
            else:
                if len(rows) >= 2:
                    a = np.asarray(rows, dtype=float)                       # (starts, cells)
                    if (a > 0).all():
                        rel = (100.0 * np.log(a)).mean(axis=1)
                        pooled_ss += float(((rel - rel.mean()) ** 2).sum())
                        pooled_df += len(rel) - 1
                        n_windows += 1
        entry: dict[str, Any] = {"pooled": None, "cells": {}}
        if pooled_df:
            entry["pooled"] = {"var": pooled_ss / pooled_df, "df": pooled_df, "windows": n_windows}
        entry["cells"] = {c: {"var": cell_ss[c] / cell_df[c], "df": cell_df[c]} for c in cell_df if cell_df[c]}
        if entry["pooled"] or entry["cells"]:
            out[m] = entry
    return out or None
