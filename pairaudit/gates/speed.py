"""win2-v1 and win2-v2: the OFF/ON/OFF speed bracket -> WIN | NO_WIN | LOSS | INCONCLUSIVE.

Stated in full, with its clauses and history, in docs/rules.md."""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from pairaudit.core.stats import paired_t_interval
from pairaudit.gates.common import registered_params

WIN2_V1 = {"win_pct": 2.0, "level": 0.95, "guard_loss_repeats": 2}


def _win2_metric(triples: Sequence[Sequence[float]], lower_is_better: bool,
                 win_pct: float, level: float) -> dict:
    t = np.asarray(triples, dtype=float)
    before, cand, after = t[:, 0], t[:, 1], t[:, 2]
    control = (before + after) / 2.0
    spread = np.abs(before - after)
    sign = -1.0 if lower_is_better else 1.0
    # "gain" is oriented so that positive always means the candidate is better.
    gain = sign * (cand - control)
    c_mean = float(control.mean())
    gain_pct = 100.0 * float(gain.mean()) / abs(c_mean) if c_mean != 0 else math.nan
    mean, lo, hi = paired_t_interval(cand - control, level)
    glo, ghi = sorted((sign * lo, sign * hi))
    if gain_pct > win_pct and glo > 0:
        verdict = "WIN"
    elif gain_pct < -win_pct and ghi < 0:
        verdict = "LOSS"
    else:
        verdict = "NO_WIN"
    worse_than_spread = [bool(-g > s) for g, s in zip(gain, spread)]
    spread_pct = [100.0 * float(s) / abs(float(c)) if c != 0 else math.nan
                  for s, c in zip(spread, control)]
    return {
        "lower_is_better": lower_is_better,
        "control": control.tolist(), "candidate": cand.tolist(),
        "control_before": before.tolist(), "control_after": after.tolist(),
        "diff": (cand - control).tolist(),
        "point_gain_pct": gain_pct,
        "t_interval": {"mean": mean, "lo": lo, "hi": hi, "level": level},
        "control_spread": spread.tolist(),
        "control_spread_pct": spread_pct,
        "max_control_spread_pct": max(spread_pct),
        "win_pct": win_pct,
        "worse_than_spread": worse_than_spread,
        "verdict": verdict,
    }


def canonical_repr(x: Any) -> str:
    """Order-independent text of a clock cap (a number, string or dict of cap facts)."""
    return json.dumps(x, sort_keys=True, default=repr)


def win2_v1(
    series: Mapping[str, Sequence[Sequence[float]]],
    *,
    primary: str,
    guards: Iterable[str] = (),
    reported: Iterable[str] = (),
    win_pct: float = 2.0,
    level: float = 0.95,
    clock_caps: Sequence[Any] | None = None,
    expected_clock_cap: Any = None,
    throttled: bool = False,
    lower_is_better: Iterable[str] = (),
    guard_loss_repeats: int = 2,
    archive_spread_pct: float | None = None,
) -> dict:
    """win2-v1: OFF/ON/OFF speed decision paired by repeat.

    series: metric -> per repeat r a triple (control_before, candidate,
    control_after). Control_r = mean of the brackets. Per metric: point gain
    % = 100 * mean oriented (candidate - control) / |mean control|, and the
    ``level`` paired-t interval of candidate - control over repeats.

    - primary: WIN if gain > win_pct and the interval excludes 0 on the
      better side; LOSS if the mirror holds (a demonstrated slowdown of more
      than the bar — our reading; the seed only names WIN); else NO_WIN.
    - guards: only cause LOSS, when worse than control by more than that
      repeat's control spread |before - after| in >= guard_loss_repeats of 3
      repeats (registered: 2 of 3). With R != 3 repeats the same fraction
      is kept: ceil(guard_loss_repeats * R / 3) repeats (2 of 2, 4 of 5).
      Under pure noise (iid normal starts) one guard flags a repeat with
      probability atan(sqrt(3/4))/pi = 0.23, so 2 of 3 gives about 13 %
      false LOSS per guard: the seed's price for a guard that can only block.
    - reported: same per-metric verdict, recorded, never decides.
    - INCONCLUSIVE first of all when clock_caps (one per start) are not all
      equal, differ from expected_clock_cap, or throttled is set: the control
      must be a same-clock control. Fewer than 2 repeats: INCONCLUSIVE.
    The in-window control spread (% of control) is reported beside the bar;
    archive_spread_pct (day-to-day, from the control archive) is passed
    through when known. The bar is a parameter, never raised silently.
    """
    guards, reported = list(guards), list(reported)
    lib = set(lower_is_better)
    params, dev, reasons = registered_params(
        {"win_pct": win_pct, "level": level, "guard_loss_repeats": guard_loss_repeats}, WIN2_V1)
    params.update(primary=primary, guards=guards, reported=reported, lower_is_better=sorted(lib))
    roles = [primary] + guards + reported
    if len(set(roles)) != len(roles):
        raise ValueError(f"a metric has more than one role: {roles}")
    missing = [m for m in roles if m not in series]
    if missing:
        raise ValueError(f"metrics {missing} absent from series")
    lengths = {m: len(series[m]) for m in roles}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"metrics have different repeat counts: {lengths}")
    for m in roles:
        for tr in series[m]:
            if len(tr) != 3 or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in tr):
                raise ValueError(f"{m}: each repeat must be 3 finite numbers (before, candidate, after), got {tr!r}")
    n_rep = lengths[primary]

    out: dict[str, Any] = {"rule": "win2-v1", "params": params, "deviations": dev,
                           "repeats": n_rep, "clock_caps": list(clock_caps) if clock_caps is not None else None,
                           "expected_clock_cap": expected_clock_cap, "throttled": bool(throttled),
                           "archive_spread_pct": archive_spread_pct}
    incon = []
    if clock_caps is not None and len({canonical_repr(c) for c in clock_caps}) > 1:
        incon.append(f"starts ran under different clock caps {list(clock_caps)}")
    if clock_caps is not None and expected_clock_cap is not None and any(
            canonical_repr(c) != canonical_repr(expected_clock_cap) for c in clock_caps):
        incon.append(f"clock caps {list(clock_caps)} differ from the configured {expected_clock_cap!r}")
    if throttled:
        incon.append("throttling was flagged inside the bracket")
    if n_rep < 2:
        incon.append(f"{n_rep} repeat(s): no paired-t interval")
        out.update(verdict="INCONCLUSIVE", reasons=reasons + incon, primary=None, guards={}, reported={})
        return out

    prim = _win2_metric(series[primary], primary in lib, win_pct, level)
    g_res = {}
    guard_losses = []
    needed = max(1, math.ceil(guard_loss_repeats * n_rep / 3 - 1e-9))
    out["guard_loss_needed"] = needed
    for g in guards:
        r = _win2_metric(series[g], g in lib, win_pct, level)
        n_worse = sum(r["worse_than_spread"])
        r["repeats_worse_than_spread"] = n_worse
        r["guard_verdict"] = "LOSS" if n_worse >= needed else "OK"
        g_res[g] = r
        if r["guard_verdict"] == "LOSS":
            guard_losses.append(f"guard {g}: candidate worse than the control spread in "
                                f"{n_worse} of {n_rep} repeats (>= {needed})")
    rep = {m: _win2_metric(series[m], m in lib, win_pct, level) for m in reported}
    out.update(primary=prim, guards=g_res, reported=rep)

    ti = prim["t_interval"]
    summary = (f"primary {primary}: point gain {prim['point_gain_pct']:+.3f} % vs bar {win_pct} %, "
               f"{int(level * 100)} % paired-t [{ti['lo']:.6g}, {ti['hi']:.6g}] on candidate-control; "
               f"in-window control/control spread max {prim['max_control_spread_pct']:.3f} %"
               + (f", archive spread {archive_spread_pct:.3f} %" if archive_spread_pct is not None else ""))
    if incon:
        verdict = "INCONCLUSIVE"
        reasons += incon
    elif guard_losses or prim["verdict"] == "LOSS":
        verdict = "LOSS"
        reasons += guard_losses
        if prim["verdict"] == "LOSS":
            reasons.append(f"primary {primary} is worse by more than {win_pct} % with the interval excluding 0")
    elif prim["verdict"] == "WIN":
        verdict = "WIN"
    else:
        verdict = "NO_WIN"
        reasons.append("speed gain not shown (gain <= bar or interval includes 0)")
    reasons.append(summary)
    for m, r in rep.items():
        reasons.append(f"reported {m}: {r['verdict']} ({r['point_gain_pct']:+.3f} %), does not decide")
    out.update(verdict=verdict, reasons=reasons)
    return out


# Registered values. start_noise_pct is the start-to-start noise (sd of one
# start's mean, % of the control) the rule assumes a host may have even when
# the window's one s1-s3 difference does not show it: that difference is a
# single degree of freedom, so a window whose two controls happen to agree
# says little about the next start. 3 % is the largest per-start offset the
# rule is calibrated against (bench/speed_noise.py).
WIN2_V2 = {"win_pct": 2.0, "alpha_win": 0.05, "alpha_loss": 0.05, "start_noise_pct": 3.0,
           "power_gain_pct": 10.0}


WIN2_V2_RATE_WINDOWS = 2000   # simulated windows behind the error rates a decision reports


WIN2_V2_RATE_SEED = 0


def _z(p: float) -> float:
    from scipy.stats import norm  # here: scipy.stats costs a second at the workflow's load

    return float(norm.ppf(p))


def _v2_metric(x: np.ndarray, lower_is_better: bool) -> dict:
    """Per window and cell, one metric: gain, s1-s3 difference and within-start variance, in % of control.

    x: (windows, cells, repeats, 3) with the starts (s1, s2, s3) last. Values
    are relative to the cell's control mean over all repeats of s1 and s3,
    oriented so that a positive gain is always better. A control mean of 0
    (e.g. accepted drafts without speculation) gives 0 for a 0 value and
    +-100 % otherwise (any drafting beats none).
    """
    c = (x[..., 0] + x[..., 2]).mean(axis=-1) / 2.0                      # (W, C)
    cz = c[..., None, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(cz != 0, 100.0 * (x / np.where(cz != 0, cz, 1.0) - 1.0),
                       np.where(x == 0, 0.0, 100.0 * np.sign(x)))
    if lower_is_better:
        rel = -rel
    m = rel.mean(axis=-2)                                                  # (W, C, 3)
    gain = m[..., 1] - (m[..., 0] + m[..., 2]) / 2.0
    d13 = m[..., 0] - m[..., 2]
    r = x.shape[-2]
    within = rel.var(axis=-2, ddof=1).mean(axis=-1) if r > 1 else np.zeros_like(gain)
    return {"gain": gain, "d13": d13, "within": within, "control_mean": c}


def _v2_noise(mt: dict, repeats: int, floor: float) -> dict:
    """The window's noise for one metric: per-repeat sd, start-level sd seen in s1-s3, and what is used."""
    rep_var = mt["within"].mean(axis=-1)                                   # (W,)
    start_var = np.maximum(0.0, (mt["d13"] ** 2).mean(axis=-1) / 2.0 - rep_var / repeats)
    used_var = np.maximum(start_var, floor ** 2)
    return {"rep_sd": np.sqrt(rep_var), "start_sd": np.sqrt(start_var), "start_sd_used": np.sqrt(used_var),
            "rep_var": rep_var, "used_var": used_var}


def _win2_v2_core(metrics: Mapping[str, np.ndarray], *, primary: str, guards: Sequence[str],
                  lower_is_better: Iterable[str], win_pct: float, alpha_win: float, alpha_loss: float,
                  start_noise_pct: float) -> dict:
    """win2-v2 over many windows at once: arrays of shape (windows, cells, repeats, 3) per metric.

    The simulation (bench/speed_noise.py) and the error rates a decision
    reports run exactly this function; ``win2_v2`` calls it with one window.
    """
    lib = set(lower_is_better)
    x = np.asarray(metrics[primary], dtype=float)
    n_cells, repeats = x.shape[1], x.shape[2]
    per = {m: _v2_metric(np.asarray(metrics[m], dtype=float), m in lib) for m in [primary, *guards]}
    noise = {m: _v2_noise(per[m], repeats, start_noise_pct) for m in per}
    z_win = _z(1.0 - alpha_win)
    # One loss test per cell and metric (primary and guards), each at alpha_loss / tests:
    # under identical arms the chance that any of them fires stays below alpha_loss.
    n_tests = n_cells * len(per)
    z_loss = _z(1.0 - alpha_loss / n_tests)
    p, pn = per[primary], noise[primary]
    # Pooled over the cells, the gain's variance keeps the whole start-level
    # part (a start's offset is shared by every cell it runs) and divides the
    # per-repeat part by cells x repeats; s2 - (s1 + s3) / 2 has 1.5 x the
    # variance of one start's mean.
    pooled = p["gain"].mean(axis=-1)
    pooled_se = np.sqrt(1.5 * (pn["used_var"] + pn["rep_var"] / (repeats * n_cells)))
    half = z_win * pooled_se
    lo = pooled - half
    consistent = (p["gain"] > win_pct).all(axis=-1)
    win = (lo > 0) & (pooled > win_pct) & consistent
    loss_by = {}
    for m in per:
        se = np.sqrt(1.5 * (noise[m]["used_var"] + noise[m]["rep_var"] / repeats))[:, None]
        g = per[m]["gain"]
        loss_by[m] = (g < -win_pct) & (g + z_loss * se < 0)                # (W, C)
    loss = np.zeros(x.shape[0], dtype=bool)
    for m in per:
        loss |= loss_by[m].any(axis=-1)
    decided = half <= win_pct
    verdict = np.where(loss, "LOSS", np.where(win, "WIN", np.where(decided, "NO_WIN", "INCONCLUSIVE")))
    return {"verdict": verdict, "per": per, "noise": noise, "pooled_gain": pooled, "pooled_se": pooled_se,
            "half_width": half, "lo": lo, "consistent": consistent, "loss_by": loss_by,
            "z_win": z_win, "z_loss": z_loss, "n_loss_tests": n_tests}


def simulate_windows(rng: np.random.Generator, n: int, *, cells: int, repeats: int, rep_sd: float,
                     start_sd: float, gain_pct: float = 0.0, metrics: Sequence[str] = ("primary",),
                     zero: Sequence[str] = ()) -> dict[str, np.ndarray]:
    """n synthetic brackets, (n, cells, repeats, 3) per metric, base 100.

    Noise in % of the mean: ``start_sd`` per start, shared by every cell,
    repeat and metric of that start (a server start that runs slow runs slow
    throughout); ``rep_sd`` per start, cell, repeat and metric, independent.
    The candidate start s2 is ``gain_pct`` % faster in every metric. Metrics
    in ``zero`` are 0 everywhere (accepted drafts of a non-speculative pair).
    """
    off = rng.normal(0.0, start_sd, (n, 1, 1, 3))
    scale = np.array([1.0, 1.0 + gain_pct / 100.0, 1.0])
    out = {}
    for m in metrics:
        if m in zero:
            out[m] = np.zeros((n, cells, repeats, 3))
            continue
        e = rng.normal(0.0, rep_sd, (n, cells, repeats, 3))
        out[m] = 100.0 * (1.0 + (off + e) / 100.0) * scale
    return out


def win2_v2_rates(*, rep_sd: float, start_sd: float, cells: int, repeats: int, guards: Sequence[str] = (),
                  zero_guards: Sequence[str] = (), win_pct: float = 2.0, alpha_win: float = 0.05,
                  alpha_loss: float = 0.05, start_noise_pct: float = 3.0, power_gain_pct: float = 10.0,
                  n: int = WIN2_V2_RATE_WINDOWS, seed: int = WIN2_V2_RATE_SEED) -> dict:
    """Seeded simulated error rates of win2-v2 at one noise level (the model of simulate_windows).

    false_win / false_loss: identical arms; power: the candidate ``power_gain_pct`` % better.
    Guards carry the same noise as the primary.
    """
    kw: dict[str, Any] = dict(primary="primary", guards=list(guards), lower_is_better=(), win_pct=win_pct,
              alpha_win=alpha_win, alpha_loss=alpha_loss, start_noise_pct=start_noise_pct)
    names = ["primary", *guards]
    rng = np.random.default_rng(seed)
    null = _win2_v2_core(simulate_windows(rng, n, cells=cells, repeats=repeats, rep_sd=rep_sd, start_sd=start_sd,
                                          metrics=names, zero=zero_guards), **kw)["verdict"]
    alt = _win2_v2_core(simulate_windows(rng, n, cells=cells, repeats=repeats, rep_sd=rep_sd, start_sd=start_sd,
                                         gain_pct=power_gain_pct, metrics=names, zero=zero_guards), **kw)["verdict"]
    return {"rep_sd_pct": rep_sd, "start_sd_pct": start_sd, "cells": cells, "repeats": repeats, "windows": n,
            "seed": seed, "false_win": float((null == "WIN").mean()), "false_loss": float((null == "LOSS").mean()),
            "null_inconclusive": float((null == "INCONCLUSIVE").mean()),
            "power_gain_pct": power_gain_pct, "power": float((alt == "WIN").mean())}


def win2_v2_needed(*, rep_sd: float, start_sd_used: float, cells: int, repeats: int, win_pct: float,
                   alpha_win: float = 0.05) -> dict:
    """How many repeats, or brackets, would make the one-sided half-width reach the bar at this noise.

    The start-level part does not shrink with repeats (every repeat of a
    start shares its offset): when it alone exceeds the bar, more repeats
    cannot help and only more brackets (s1, s2, s3 starts, pooled) can.
    """
    z = _z(1.0 - alpha_win)
    budget = (win_pct / z) ** 2 / 1.5             # allowed variance of the start-level mean
    start_var, rep_var = start_sd_used ** 2, rep_sd ** 2
    if start_var >= budget:
        repeats_needed = None
    else:
        repeats_needed = max(repeats, math.ceil(rep_var / (cells * (budget - start_var)) - 1e-9))
    total = start_var + rep_var / (cells * repeats)
    brackets = max(1, math.ceil(total / budget - 1e-9)) if budget > 0 else None
    return {"repeats_needed": repeats_needed, "brackets_needed": brackets,
            "half_width_pct": z * math.sqrt(1.5 * total)}


def _nums(a: np.ndarray) -> list:
    return [float(v) for v in np.ravel(a)]


def _check_cells(cells: Mapping[str, Mapping[str, Sequence[Sequence[float]]]], roles: Sequence[str],
                 decide: Sequence[str], rule: str) -> tuple[int, int]:
    """(repeats, starts) of a pooled rule's series, or a ValueError naming the cell, metric or role."""
    if len(set(roles)) != len(roles):
        raise ValueError(f"a metric has more than one role: {list(roles)}")
    if not decide:
        raise ValueError(f"{rule} needs at least one deciding cell")
    shapes = set()
    for c in cells:
        missing = [m for m in roles if m not in cells[c]]
        if missing:
            raise ValueError(f"cell {c}: metrics {missing} absent from series")
        for m in roles:
            for rep in cells[c][m]:
                if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in rep):
                    raise ValueError(f"{c}/{m}: every start's value must be a finite number, got {rep!r}")
                shapes.add((len(cells[c][m]), len(rep)))
    if len(shapes) != 1:
        raise ValueError(f"cells and metrics have different repeats x starts: {sorted(shapes)}")
    return shapes.pop()


def win2_v2(
    cells: Mapping[str, Mapping[str, Sequence[Sequence[float]]]],
    *,
    primary: str,
    guards: Iterable[str] = (),
    reported: Iterable[str] = (),
    decide: Iterable[str] | None = None,
    lower_is_better: Iterable[str] = (),
    win_pct: float = 2.0,
    alpha_win: float = 0.05,
    alpha_loss: float = 0.05,
    start_noise_pct: float = 3.0,
    power_gain_pct: float = 10.0,
    with_rates: bool = True,
) -> dict:
    """win2-v2: the OFF/ON/OFF speed decision over every deciding cell at once.

    cells: cell -> metric -> per repeat (s1, s2, s3). decide: the deciding
    cells (default: all); the others get their own reported verdict. All
    values are % of the cell's control mean (s1 and s3 over every repeat),
    oriented so that a positive gain is better.

    Per cell and metric: gain = mean(s2) - (mean(s1) + mean(s3)) / 2, the
    s1-s3 difference and the within-start variance of the repeats. The
    window's noise (per metric, pooled over the deciding cells): per-repeat
    sd from the within-start variance, start-level sd from the s1-s3
    differences beyond what the repeats explain. The start-level sd used is
    the larger of that and ``start_noise_pct`` (one s1-s3 difference is one
    degree of freedom, so an agreeing pair of controls does not show a quiet
    host). Var(gain) = 1.5 x (start var + repeat var / repeats).

    - WIN: the cells' mean primary gain exceeds the bar, its one-sided
      (1 - alpha_win) lower bound exceeds 0 (the start-level variance is kept
      whole: a start's offset is shared by its cells), and every deciding
      cell's gain exceeds the bar.
    - LOSS: in some deciding cell the primary or a guard is worse than the
      bar and its upper bound, at alpha_loss divided by the number of such
      tests (cells x metrics), is below 0: a slowdown the window's noise does
      not explain. A guard cannot make a WIN.
    - otherwise NO_WIN when the window resolves the bar (one-sided half-width
      <= win_pct), else INCONCLUSIVE, with the repeats (or brackets) it
      would need.
    Clock checks are the stage's (speed.decision.decide), not this function's. The
    result names the window's noise and, when ``rates``, the rule's
    simulated false WIN / false LOSS / power at that noise and at the noise
    it assumes (``with_rates``).
    """
    guards, reported = list(guards), list(reported)
    lib = set(lower_is_better)
    registered = dict(WIN2_V2)
    params, dev, reasons = registered_params({"win_pct": win_pct, "alpha_win": alpha_win, "alpha_loss": alpha_loss,
                                    "start_noise_pct": start_noise_pct, "power_gain_pct": power_gain_pct},
                                   registered)
    names = list(cells)
    decide = names if decide is None else [c for c in names if c in set(decide)]
    params.update(primary=primary, guards=guards, reported=reported, lower_is_better=sorted(lib),
                  decision_cells=list(decide))
    roles = [primary] + guards + reported
    if len(set(roles)) != len(roles):
        raise ValueError(f"a metric has more than one role: {roles}")
    if not decide:
        raise ValueError("win2-v2 needs at least one deciding cell")
    reps = set()
    for c in names:
        missing = [m for m in roles if m not in cells[c]]
        if missing:
            raise ValueError(f"cell {c}: metrics {missing} absent from series")
        for m in roles:
            reps.add(len(cells[c][m]))
            for tr in cells[c][m]:
                if len(tr) != 3 or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in tr):
                    raise ValueError(f"{c}/{m}: each repeat must be 3 finite numbers (s1, s2, s3), got {tr!r}")
    if len(reps) != 1:
        raise ValueError(f"cells and metrics have different repeat counts: {sorted(reps)}")
    n_rep = reps.pop()
    out: dict[str, Any] = {"rule": "win2-v2", "params": params, "deviations": dev, "repeats": n_rep}
    if n_rep < 2:
        out.update(verdict="INCONCLUSIVE", reasons=reasons + [f"{n_rep} repeat(s): no within-start noise"],
                   cells={}, noise=None, rates=None)
        return out
    kw: dict[str, Any] = dict(primary=primary, guards=guards, lower_is_better=lib, win_pct=win_pct, alpha_win=alpha_win,
              alpha_loss=alpha_loss, start_noise_pct=start_noise_pct)

    def arr(cs, m):
        return np.asarray([[cells[c][m] for c in cs]], dtype=float)      # (1, C, R, 3)

    core = _win2_v2_core({m: arr(decide, m) for m in [primary, *guards]}, **kw)
    pn = core["noise"][primary]
    noise: dict[str, Any] = {"rep_sd_pct": float(pn["rep_sd"][0]), "start_sd_pct": float(pn["start_sd"][0]),
             "start_sd_used_pct": float(pn["start_sd_used"][0]),
             "s1_s3_diff_pct": _nums(core["per"][primary]["d13"]),
             "guards": {g: {"rep_sd_pct": float(core["noise"][g]["rep_sd"][0]),
                            "start_sd_pct": float(core["noise"][g]["start_sd"][0])} for g in guards}}
    need = win2_v2_needed(rep_sd=noise["rep_sd_pct"], start_sd_used=noise["start_sd_used_pct"],
                          cells=len(decide), repeats=n_rep, win_pct=win_pct, alpha_win=alpha_win)
    gain, half = float(core["pooled_gain"][0]), float(core["half_width"][0])
    verdict = str(core["verdict"][0])
    per_cell: dict[str, dict[str, Any]] = {}
    for j, c in enumerate(decide):
        cell_loss = [m for m in core["loss_by"] if core["loss_by"][m][0, j]]
        cg = float(core["per"][primary]["gain"][0, j])
        per_cell[c] = {"decides": True, "primary": {"point_gain_pct": cg,
                                                    "s1_s3_diff_pct": float(core["per"][primary]["d13"][0, j]),
                                                    "within_sd_pct": math.sqrt(float(core["per"][primary]["within"][0, j]))},
                       "guards": {g: {"point_gain_pct": float(core["per"][g]["gain"][0, j]),
                                      "guard_verdict": "LOSS" if g in cell_loss else "OK"} for g in guards},
                       "losses": cell_loss,
                       "verdict": "LOSS" if cell_loss else ("ABOVE_BAR" if cg > win_pct else "NOT_ABOVE_BAR")}
    # Cells that do not decide, and reported metrics: the same test, recorded only.
    for c in [c for c in names if c not in decide]:
        one = _win2_v2_core({m: arr([c], m) for m in [primary, *guards]}, **kw)
        per_cell[c] = {"decides": False, "verdict": str(one["verdict"][0]),
                       "primary": {"point_gain_pct": float(one["pooled_gain"][0]),
                                   "s1_s3_diff_pct": float(one["per"][primary]["d13"][0, 0])},
                       "guards": {g: {"point_gain_pct": float(one["per"][g]["gain"][0, 0]),
                                      "guard_verdict": "LOSS" if one["loss_by"][g][0, 0] else "OK"} for g in guards}}
    rep_res = {}
    for m in reported:
        one = _win2_v2_core({m: arr(decide, m)}, **{**kw, "primary": m, "guards": []})
        rep_res[m] = {"verdict": str(one["verdict"][0]), "point_gain_pct": float(one["pooled_gain"][0]),
                      "lower_is_better": m in lib}
    summary = (f"primary {primary}: gain {gain:+.2f} % over {len(decide)} deciding cell(s) vs bar {win_pct} %, "
               f"one-sided {100 * (1 - alpha_win):g} % lower bound {gain - half:+.2f} % (half-width {half:.2f} %); "
               f"window noise: per repeat {noise['rep_sd_pct']:.2f} %, start to start {noise['start_sd_pct']:.2f} % "
               f"from s1-s3 (used {noise['start_sd_used_pct']:.2f} %, floor {start_noise_pct} %)")
    if verdict == "LOSS":
        for c, pc in per_cell.items():
            if pc.get("decides") and pc.get("losses"):
                reasons.append(f"{c}: {', '.join(pc['losses'])} worse than the bar beyond the window's noise "
                               f"(each loss test at {100 * alpha_loss / core['n_loss_tests']:.3g} %)")
    elif verdict == "WIN":
        reasons.append("gain above the bar in every deciding cell and its lower bound above 0")
    elif verdict == "NO_WIN":
        reasons.append("speed gain not shown, and the window resolves the bar (half-width <= bar)")
    else:
        how = (f"would need {need['repeats_needed']} repeats per start, or {need['brackets_needed']} brackets "
               "pooled" if need["repeats_needed"] is not None
               else "more repeats cannot help (the start-to-start part alone exceeds the bar); would need "
               f"{need['brackets_needed']} brackets pooled")
        reasons.append(f"too noisy to decide at the {win_pct} % bar: half-width {half:.2f} % > {win_pct} %; {how}")
    reasons.append(summary)
    if not core["consistent"][0] and verdict != "LOSS":
        low = [c for c in decide if per_cell[c]["primary"]["point_gain_pct"] <= win_pct]
        reasons.append(f"cells not above the bar: {low}")
    for m, r in rep_res.items():
        reasons.append(f"reported {m}: {r['verdict']} ({r['point_gain_pct']:+.3f} %), does not decide")
    rates = None
    if with_rates:
        zero = [g for g in guards if all(v == 0 for c in decide for tr in cells[c][g] for v in tr)]
        common: dict[str, Any] = dict(cells=len(decide), repeats=n_rep, guards=guards, zero_guards=zero,
                                      win_pct=win_pct, alpha_win=alpha_win, alpha_loss=alpha_loss,
                                      start_noise_pct=start_noise_pct, power_gain_pct=power_gain_pct)
        rates = {"measured": win2_v2_rates(rep_sd=noise["rep_sd_pct"], start_sd=noise["start_sd_pct"], **common),
                 "assumed": win2_v2_rates(rep_sd=noise["rep_sd_pct"], start_sd=noise["start_sd_used_pct"], **common)}
        m_, a_ = rates["measured"], rates["assumed"]
        reasons.append(f"win2-v2 at this window's noise: false WIN {100 * m_['false_win']:.1f} %, false LOSS "
                       f"{100 * m_['false_loss']:.1f} %, WIN for a +{power_gain_pct:g} % change "
                       f"{100 * m_['power']:.1f} %; with start-to-start noise {a_['start_sd_pct']:.2f} %: "
                       f"{100 * a_['false_win']:.1f} % / {100 * a_['false_loss']:.1f} % / {100 * a_['power']:.1f} % "
                       f"({m_['windows']} simulated windows, seed {m_['seed']})")
    out.update(verdict=verdict, reasons=reasons, cells=per_cell, reported=rep_res, noise=noise, needed=need,
               pooled_gain_pct=gain, half_width_pct=half, lower_bound_pct=gain - half,
               loss_tests=core["n_loss_tests"], rates=rates)
    return out


# ----------------------------------------------------------------- win2-v3
#
# Registered values. The bracket grows C, T, C, T, C ... up to max_starts, and
# the gate looks after every candidate/control pair; each look tests at
# alpha / looks (a union bound), so the false WIN and false LOSS rates of the
# whole sequence stay at or below alpha_win and alpha_loss. min_df: below this
# many degrees of freedom for the start-to-start variance the rule does not
# trust the estimate and uses start_noise_pct instead (the fallback).
WIN2_V3 = {"win_pct": 2.0, "alpha_win": 0.05, "alpha_loss": 0.05, "start_noise_pct": 3.0, "min_df": 2,
           "evidence_f_alpha": 0.05}
# win2-v4: win2-v3's bracket and statistics with two changes of how alpha is spent.
# spending "obf": each test's alpha is spent over the looks by the Lan-DeMets
# O'Brien-Fleming-type function instead of alpha / looks at every look: early
# looks are stricter, the last one is nearly at alpha (the union bound spent a
# quarter of it at each of four looks). loss_pooled_share: the loss test on the
# primary pooled over the cells (the one that sees a uniform slowdown) gets
# this share of alpha_loss, the per-cell tests split the rest, instead of an
# equal share for every test. Both keep the false WIN and false LOSS rates of
# the whole sequence at or below alpha_win and alpha_loss.
WIN2_V4 = {**WIN2_V3, "spending": "obf", "loss_pooled_share": 0.5}
SPENDING = ("obf", "bonferroni")


def _q(p: float, df: float | None) -> float:
    """Upper p-quantile: Student-t with ``df`` degrees of freedom, the normal where df is None."""
    from scipy.stats import norm, t  # here: scipy.stats costs a second at the workflow's load

    return float(norm.ppf(p)) if df is None else float(t.ppf(p, df))


def bracket_arms(n_starts: int) -> list[str]:
    """The arms of an alternating bracket of ``n_starts`` starts: control, candidate, control, ..."""
    if n_starts < 3 or n_starts % 2 == 0:
        raise ValueError(f"a bracket has an odd number of starts >= 3 (control first and last), got {n_starts}")
    return ["control" if k % 2 == 0 else "candidate" for k in range(n_starts)]


def looks_for(max_starts: int) -> int:
    """How many times the sequential bracket may decide: after 3, 5, ... max_starts starts."""
    return 1 + (max_starts - 3) // 2


def information_fractions(looks: int) -> tuple[float, ...]:
    """Each look's share of the last look's information: 1 / arm_factor(starts), starts 3, 5, ..."""
    info = [1.0 / arm_factor(3 + 2 * k) for k in range(looks)]
    return tuple(i / info[-1] for i in info)


@functools.lru_cache(maxsize=512)
def obf_levels(alpha: float, fractions: tuple[float, ...], grid: int = 801) -> tuple[float, ...]:
    """One-sided nominal levels per look of a group-sequential test, O'Brien-Fleming-type spending.

    The Lan-DeMets spending function alpha(t) = 2 (1 - Phi(z_{1-alpha/2} / sqrt t))
    gives how much of alpha may be spent by information fraction t; the
    boundary of each look is solved so that the chance of a first crossing
    there, under no effect, is exactly that look's increment. The score
    process is a Brownian motion in the information; its density below the
    earlier boundaries is carried from look to look on a grid (the
    Armitage-McPherson-Rowe recursion), so the levels are deterministic.
    Returns P(Z >= c_k) per look: the level each look tests at.
    """
    from scipy.optimize import brentq
    from scipy.stats import norm

    z = float(norm.ppf(1.0 - alpha / 2.0))
    spent = [2.0 * float(norm.sf(z / math.sqrt(t))) for t in fractions]
    levels: list[float] = []
    xs = dens = None
    prev_t, prev_spent = 0.0, 0.0
    for t, cum in zip(fractions, spent):
        inc = max(cum - prev_spent, 1e-300)
        if xs is None:
            b = float(norm.isf(inc)) * math.sqrt(t)
        else:
            sd = math.sqrt(t - prev_t)
            w = np.full(xs.size, xs[1] - xs[0])
            w[0] = w[-1] = w[0] / 2.0
            mass = w * dens

            def cross(bk, mass=mass, sd=sd, xs=xs):
                return float((mass * norm.sf((bk - xs) / sd)).sum()) - inc

            lo, hi = xs[-1] - 10.0 * sd, xs[-1] + 10.0 * sd
            b = float(brentq(cross, lo, hi, xtol=1e-10)) if cross(lo) > 0 > cross(hi) else hi
        levels.append(float(norm.sf(b / math.sqrt(t))))
        # the density of the score below this boundary, for the next look
        new = np.linspace(min(b, 0.0) - 9.0 * math.sqrt(t), b, grid)
        if xs is None:
            dens = norm.pdf(new / math.sqrt(t)) / math.sqrt(t)
        else:
            sd = math.sqrt(t - prev_t)
            w = np.full(xs.size, xs[1] - xs[0])
            w[0] = w[-1] = w[0] / 2.0
            dens = (norm.pdf((new[:, None] - xs[None, :]) / sd) / sd) @ (w * dens)
        xs, prev_t, prev_spent = new, t, cum
    return tuple(levels)


def look_level(alpha: float, looks: int, look: int, spending: str) -> float:
    """The one-sided level a test spends at ``look`` (0-based) of ``looks``: alpha / looks, or O'Brien-Fleming's."""
    if spending == "bonferroni":
        return alpha / looks
    if spending == "obf":
        return obf_levels(float(alpha), information_fractions(looks))[look]
    raise ValueError(f"spending {spending!r}: not one of {list(SPENDING)}")


def arm_factor(n_starts: int) -> float:
    """Var(mean of the candidate starts - mean of the control starts) / sigma^2 for an alternating bracket.

    C, T, C, ... C puts both arms' mean position at the bracket's middle, so a
    linear drift of the host cancels in the difference of the arm means, as
    it does in pairing each candidate start with its two neighbours; unlike
    that pairing, the arm means are orthogonal to the within-arm deviations
    the variance is estimated from, so the t statistic is exact.
    """
    n_cand = n_starts // 2
    return 1.0 / n_cand + 1.0 / (n_starts - n_cand)


def _v3_start_values(x: np.ndarray, lower_is_better: bool) -> np.ndarray:
    """(..., repeats, starts) raw values -> (..., starts) per-start means in log-% of the control, oriented.

    Every start runs the same prompts at the same repeat index, so a prompt
    that decodes slower slows every start alike: averaging over repeats per
    start keeps that effect identical in every start, and every difference
    between starts cancels it. Positive metrics are compared on the log scale
    (100 ln(x / geometric mean of the controls), about % for small effects): a
    ratio of speeds is symmetric there, where x / mean - 1 is skewed by the
    noise of its own denominator. A metric that is 0 somewhere (accepted
    drafts without speculation) stays linear, 0 against 0 and +-100 against a
    control of 0 (any drafting beats none).
    """
    x = np.asarray(x, dtype=float)
    positive = (x > 0).all(axis=(-1, -2), keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        lx = np.log(np.where(positive, x, 1.0))
        log_rel = 100.0 * (lx - lx[..., 0::2].mean(axis=(-1, -2), keepdims=True))
        c = x[..., 0::2].mean(axis=(-1, -2), keepdims=True)
        lin = np.where(c != 0, 100.0 * (x / np.where(c != 0, c, 1.0) - 1.0),
                       np.where(x == 0, 0.0, 100.0 * np.sign(x)))
    rel = np.where(positive, log_rel, lin)
    if lower_is_better:
        rel = -rel
    return rel.mean(axis=-2)


def log_bar(pct: float) -> float:
    """A bar in % of the control as a bar on the log scale the gate tests on: 100 ln(1 + pct / 100)."""
    return 100.0 * math.log1p(pct / 100.0)


def pct_of_log(v: float) -> float:
    """A log-scale gain (100 ln ratio) as % of the control."""
    return 100.0 * math.expm1(v / 100.0)


def _v3_gain(m: np.ndarray) -> np.ndarray:
    """(..., starts) -> (...): the mean of the candidate starts minus the mean of the control starts."""
    return m[..., 1::2].mean(axis=-1) - m[..., 0::2].mean(axis=-1)


def _v3_window_var(m: np.ndarray) -> tuple[np.ndarray, int]:
    """Within-arm variance of the start values (a slow drift only inflates it) and its degrees of freedom."""
    c, t = m[..., 0::2], m[..., 1::2]
    nc, nt = c.shape[-1], t.shape[-1]
    ss = ((c - c.mean(axis=-1, keepdims=True)) ** 2).sum(axis=-1)
    if nt > 1:
        ss = ss + ((t - t.mean(axis=-1, keepdims=True)) ** 2).sum(axis=-1)
    df = (nc - 1) + max(0, nt - 1)
    return ss / df, df


# ----------------------------------------------------- the shared-control bracket
#
# Several candidates against one control: the starts run C, T1, C, T2, ..., Tn, C,
# then T, C for each candidate still undecided, so the bracket stays alternating
# (every even start a control) and every candidate start sits between two control
# starts: its window C-T-C. Windows of one candidate that share a control (T_n's
# last window of a round and its first of the next) form one run, which is
# win2-v4's alternating bracket of that candidate; a candidate with one run is
# exactly win2-v4's bracket.

CONTROL = "control"


@dataclass(frozen=True)
class SweepLayout:
    """Where one candidate's windows lie in a shared-control bracket, and the statistics over them.

    runs: per run of adjacent windows (sharing their inner controls), its control starts and its
    candidate starts (indices into the bracket). others: the bracket's control starts outside every run
    of this candidate, pooled into the start-to-start variance as a group of their own.
    """
    candidate: str
    arms: tuple[str, ...]
    runs: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]
    others: tuple[int, ...]

    @property
    def n_windows(self) -> int:
        return sum(len(t) for _, t in self.runs)

    @property
    def windows(self) -> list[tuple[int, int, int]]:
        """(control before, candidate, control after) per candidate start, in run order."""
        return [(k - 1, k, k + 1) for _, t in self.runs for k in t]

    @property
    def controls(self) -> tuple[int, ...]:
        """The control starts the candidate is compared to: its windows' neighbours."""
        return tuple(sorted(k for c, _ in self.runs for k in c))

    @property
    def starts(self) -> tuple[int, ...]:
        """The candidate's own bracket: its windows' starts in run order."""
        return tuple(sorted({k for c, t in self.runs for k in (*c, *t)}))

    @property
    def factor(self) -> float:
        """Var(gain) / sigma^2: runs weighted by their candidate starts, each run win2-v4's arm_factor."""
        m = self.n_windows
        return sum((len(t) / m) ** 2 * (1.0 / len(t) + 1.0 / len(c)) for c, t in self.runs)

    def gain(self, v: np.ndarray) -> np.ndarray:
        """(..., starts) -> (...): per run the mean of its candidate starts minus that of its controls,
        weighted by the run's candidate starts (within a run both arms' mean position is the run's middle, so
        a linear drift cancels run by run)."""
        m = self.n_windows
        return sum((len(t) / m) * (v[..., list(t)].mean(axis=-1) - v[..., list(c)].mean(axis=-1))
                   for c, t in self.runs)

    def window_var(self, v: np.ndarray) -> tuple[np.ndarray, int]:
        """Start-to-start variance from deviations within groups, each about its own mean: each run's controls,
        all the candidate's starts (the runs' weights make the gain's candidate part their plain mean), the
        other control starts. Orthogonal to every mean the gain is made of, so the t statistic stays exact;
        a drift only inflates it."""
        groups = [c for c, _ in self.runs] + [tuple(k for _, t in self.runs for k in t)] + (
            [self.others] if self.others else [])
        ss = sum(((v[..., list(g)] - v[..., list(g)].mean(axis=-1, keepdims=True)) ** 2).sum(axis=-1)
                 for g in groups)
        df = sum(len(g) - 1 for g in groups)
        return ss / df, df


def sweep_layout(arms: Sequence[str], candidate: str, *, pool_controls: bool = True) -> SweepLayout:
    """The candidate's windows in a shared-control bracket ``arms`` (one arm name per start, ``CONTROL`` or a
    candidate's name); ``pool_controls``: the bracket's other control starts join the variance."""
    arms = tuple(arms)
    if len(arms) < 3 or len(arms) % 2 == 0 or any(a != CONTROL for a in arms[0::2]) or any(
            a == CONTROL for a in arms[1::2]):
        raise ValueError(f"a shared-control bracket alternates control and candidate starts, control first and last, "
                         f"got {list(arms)}")
    mine = [k for k, a in enumerate(arms) if a == candidate]
    if not mine:
        raise ValueError(f"candidate {candidate!r} has no start in the bracket {list(arms)}")
    runs: list[list[int]] = [[mine[0]]]
    for k in mine[1:]:
        if k == runs[-1][-1] + 2:
            runs[-1].append(k)
        else:
            runs.append([k])
    shaped = tuple((tuple(range(r[0] - 1, r[-1] + 2, 2)), tuple(r)) for r in runs)
    inside = {k for c, _ in shaped for k in c}
    others = tuple(k for k in range(0, len(arms), 2) if k not in inside) if pool_controls else ()
    return SweepLayout(candidate=candidate, arms=arms, runs=shaped, others=others)


def sweep_round(arms: Sequence[str], candidates: Sequence[str], open_: Iterable[str]) -> list[str]:
    """The starts a shared-control bracket appends next: the first round C, T1, C, ..., Tn, C on an empty
    bracket, later rounds T, C for each candidate still open (undecided, budget left), in bracket order."""
    if len(set(candidates)) != len(candidates) or CONTROL in candidates or not candidates:
        raise ValueError(f"candidates must be distinct names other than {CONTROL!r}, got {list(candidates)}")
    if not arms:
        return [CONTROL] + [a for c in candidates for a in (c, CONTROL)]
    wanted = set(open_)
    return [a for c in candidates if c in wanted for a in (c, CONTROL)]


def sweep_windows(arms: Sequence[str], candidate: str) -> int:
    """How many windows (candidate starts) a candidate has in the bracket so far."""
    return sum(1 for a in arms if a == candidate)


def sweep_next(arms: Sequence[str], candidates: Sequence[str], undecided: Iterable[str], budget: int) -> list[str]:
    """The next round of a shared-control bracket: the first round on an empty bracket, then T, C for each
    undecided candidate with fewer than ``budget`` candidate starts (a decided candidate gets no more)."""
    return sweep_round(arms, candidates, [c for c in undecided if sweep_windows(arms, c) < budget])


def _v3_noise(win_var: np.ndarray, win_df: int, ev_var: np.ndarray | float | None, ev_df: int, *,
              floor: float, min_df: float, f_alpha: float) -> dict:
    """The start-to-start variance the gate uses: the window's, pooled with the host's evidence where they agree.

    Evidence (earlier windows of the same control on this host) is pooled
    unless the window's own variance is significantly larger (one-sided F
    test at ``f_alpha``): a candidate that makes the host noisier must not
    borrow a quiet history. Below ``min_df`` degrees of freedom the
    registered floor is the least variance used (the t quantile of the
    degrees of freedom seen still applies).
    """
    from scipy.stats import f as f_dist

    win_var = np.asarray(win_var, dtype=float)
    if ev_var is not None and ev_df > 0:
        ev = np.broadcast_to(np.asarray(ev_var, dtype=float), win_var.shape)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(ev > 0, win_var / np.where(ev > 0, ev, 1.0), np.where(win_var > 0, np.inf, 1.0))
        crit = float(f_dist.ppf(1.0 - f_alpha, win_df, ev_df))
        pool = ratio <= crit
        var = np.where(pool, (win_df * win_var + ev_df * ev) / (win_df + ev_df), win_var)
        df = np.where(pool, win_df + ev_df, win_df)
    else:
        pool = np.zeros(win_var.shape, dtype=bool)
        var, df = win_var, np.full(win_var.shape, win_df)
    fallback = df < min_df
    used = np.where(fallback, np.maximum(var, floor ** 2), var)
    return {"var": var, "df": df, "pooled_evidence": pool, "fallback": fallback, "used_var": used}


# Below this many degrees of freedom of the start-to-start variance, win2-v4's group-sequential level
# is used only where it is stricter than alpha / looks: the levels are solved for a known variance,
# and applied to t statistics with few degrees of freedom they let through more than alpha (simulated:
# 5.5 % false WIN at 8 % start-to-start noise with no host evidence); at this many they do not.
GS_MIN_DF = 8


def _levels(alpha: float, looks: int, look: int, spending: str, df: np.ndarray) -> np.ndarray:
    """The level a test spends at this look, per window: its spending's, capped at alpha / looks on few df."""
    df = np.asarray(df)
    level = look_level(alpha, looks, look, spending)
    if spending == "bonferroni":
        return np.full(df.shape, level)
    return np.where(df >= GS_MIN_DF, level, min(level, alpha / looks))


def _quantiles(p: float | np.ndarray, df: np.ndarray) -> np.ndarray:
    """Student-t at the variance's degrees of freedom, the fallback's too.

    The fallback raises the variance to the floor but keeps the t quantile of
    the degrees of freedom actually seen: a host noisier than the floor then
    stays undecided at one bracket instead of deciding on a variance that a
    single control pair happened to understate.
    """
    from scipy.stats import t

    return np.asarray(t.ppf(p, np.maximum(df, 1)))


def _win2_v3_core(metrics: Mapping[str, np.ndarray], *, primary: str, guards: Sequence[str],
                  lower_is_better: Iterable[str], win_pct: float, alpha_win: float, alpha_loss: float,
                  start_noise_pct: float, min_df: int, evidence_f_alpha: float, looks: int,
                  evidence: Mapping[str, Mapping[str, Any]] | None = None, spending: str = "bonferroni",
                  loss_pooled_share: float | None = None, layout: SweepLayout | None = None) -> dict:
    """win2-v3 / win2-v4 at one look over many windows: arrays (windows, cells, repeats, starts) per metric.

    ``evidence``: metric -> {"pooled": (var, df), "cells": [(var, df) or None per cell]} from the host's
    earlier windows of this control (variances in %^2 of the control; a var may be an array, one per
    window), or None. ``spending`` and ``loss_pooled_share``: how alpha is spent over the looks and over
    the loss tests (win2-v3: bonferroni and an equal share; win2-v4: obf and a share for the pooled test).
    ``layout``: one candidate of a shared-control bracket (``sweep_layout``): its gain, variance factor,
    look and start-to-start variance come from its own windows and the bracket's other control starts.
    The simulation runs exactly this.
    """
    lib = set(lower_is_better)
    evidence = evidence or {}
    x = np.asarray(metrics[primary], dtype=float)
    n_cells, n_starts = x.shape[1], x.shape[-1]
    gain_of, var_of = (_v3_gain, _v3_window_var) if layout is None else (layout.gain, layout.window_var)
    if layout is not None and len(layout.arms) != n_starts:
        raise ValueError(f"the layout has {len(layout.arms)} starts, the series {n_starts}")
    fac = arm_factor(n_starts) if layout is None else layout.factor
    kw: dict[str, float] = dict(floor=start_noise_pct, min_df=min_df, f_alpha=evidence_f_alpha)
    vals = {m: _v3_start_values(np.asarray(metrics[m], dtype=float), m in lib) for m in [primary, *guards]}
    # pooled over the deciding cells: a start's offset is shared by every cell it runs
    pm = vals[primary].mean(axis=1)                                         # (W, S)
    pooled_gain = gain_of(pm)
    wv, wdf = var_of(pm)
    ev = evidence.get(primary, {}).get("pooled")
    pn = _v3_noise(wv, wdf, None if ev is None else ev[0], 0 if ev is None else int(ev[1]), **kw)
    se = np.sqrt(fac * pn["used_var"])
    look = (n_starts - 3) // 2 if layout is None else layout.n_windows - 1
    level_win = _levels(alpha_win, looks, look, spending, pn["df"])
    q_win = _quantiles(1.0 - level_win, pn["df"])
    half = q_win * se
    # the bar on the log scale: a win is a ratio above 1 + bar, a loss one below 1 - bar
    up, down = log_bar(win_pct), -log_bar(-win_pct) if win_pct < 100 else math.inf
    cell_gain = {m: gain_of(v) for m, v in vals.items()}                  # (W, C)
    consistent = (cell_gain[primary] > up).all(axis=-1)
    win = (pooled_gain - half > 0) & (pooled_gain > up) & consistent
    # one loss test per cell and metric, plus the primary pooled over the cells (it borrows every cell's
    # repeats and the host's evidence, so it sees a uniform slowdown no single cell can show alone)
    n_tests = n_cells * len(vals) + 1
    if loss_pooled_share is None:
        a_pool = a_cell = alpha_loss / n_tests
    else:
        a_pool, a_cell = alpha_loss * loss_pooled_share, alpha_loss * (1.0 - loss_pooled_share) / (n_tests - 1)
    level_pool = _levels(a_pool, looks, look, spending, pn["df"])
    q_pool_loss = _quantiles(1.0 - level_pool, pn["df"])
    pooled_loss = (pooled_gain < -down) & (pooled_gain + q_pool_loss * se < 0)
    loss_by, cell_noise, cell_levels = {}, {}, []
    for m, v in vals.items():
        cv, cdf = var_of(v)                                                 # (W, C)
        cells_ev = evidence.get(m, {}).get("cells")
        if cells_ev is not None:
            nz = [_v3_noise(cv[:, j], cdf, None if e is None else e[0], 0 if e is None else int(e[1]), **kw)
                  for j, e in enumerate(cells_ev)]
            cn = {k: np.stack([z[k] for z in nz], axis=-1) for k in ("var", "df", "fallback", "used_var")}
        else:
            cn = _v3_noise(cv, cdf, None, 0, **kw)
        level_cell = _levels(a_cell, looks, look, spending, cn["df"])
        cell_levels.append(level_cell.min(axis=-1))
        q_loss = _quantiles(1.0 - level_cell, cn["df"])
        g = cell_gain[m]
        loss_by[m] = (g < -down) & (g + q_loss * np.sqrt(fac * cn["used_var"]) < 0)
        cell_noise[m] = cn
    loss = pooled_loss.copy()
    for m in loss_by:
        loss |= loss_by[m].any(axis=-1)
    decided = half <= up
    verdict = np.where(loss, "LOSS", np.where(win, "WIN", np.where(decided, "NO_WIN", "INCONCLUSIVE")))
    return {"verdict": verdict, "values": vals, "pooled_values": pm, "pooled_gain": pooled_gain, "se": se,
            "half_width": half, "q_win": q_win, "noise": pn, "window_var": wv, "window_df": wdf,
            "cell_gain": cell_gain, "cell_noise": cell_noise, "consistent": consistent, "loss_by": loss_by,
            "pooled_loss": pooled_loss, "n_loss_tests": n_tests, "factor": fac, "n_starts": n_starts,
            "levels": {"win": level_win, "loss_pooled": level_pool, "loss_cell": np.min(cell_levels, axis=0)}}


def _v3_pct(values: np.ndarray, gain: float) -> float:
    """A cell metric's gain in %: from the log scale where its values are all positive, else already linear."""
    return float(gain) if not np.isfinite(values).all() or (np.asarray(values) == 0).any() else pct_of_log(float(gain))


def repeat_noise_sd(x: np.ndarray) -> float:
    """Per-repeat noise in % of the control with the prompts' own speed removed (two-way residual sd).

    x: (cells, repeats, starts). Each repeat index is the same prompts in
    every start, so the repeat's mean over starts is that prompt's speed, not
    noise; what is left after removing it and each start's mean is.
    """
    out = []
    for cell in np.asarray(x, dtype=float):
        c = cell[:, 0::2].mean()
        if c == 0:
            continue
        rel = 100.0 * (cell / c - 1.0)
        r, s = rel.shape
        if r < 2 or s < 2:
            continue
        res = rel - rel.mean(axis=1, keepdims=True) - rel.mean(axis=0, keepdims=True) + rel.mean()
        out.append((res ** 2).sum() / ((r - 1) * (s - 1)))
    return math.sqrt(float(np.mean(out))) if out else 0.0


def simulate_sequences(rng: np.random.Generator, n: int, *, cells: int, repeats: int, rep_sd: float,
                       start_sd: float, max_starts: int, gain_pct: float = 0.0, prompt_sd: float = 0.0,
                       metrics: Sequence[str] = ("primary",), zero: Sequence[str] = ()) -> dict[str, np.ndarray]:
    """n synthetic alternating brackets of ``max_starts`` starts, (n, cells, repeats, max_starts) per metric.

    As simulate_windows, plus ``prompt_sd``: a per (cell, repeat) speed shared by every start (the same
    prompts at the same repeat index decode at their own speed). Candidate starts are ``gain_pct`` % faster.
    """
    off = rng.normal(0.0, start_sd, (n, 1, 1, max_starts))
    prompt = rng.normal(0.0, prompt_sd, (n, cells, repeats, 1))
    scale = np.array([1.0 + (gain_pct / 100.0 if k % 2 else 0.0) for k in range(max_starts)])
    out = {}
    for m in metrics:
        if m in zero:
            out[m] = np.zeros((n, cells, repeats, max_starts))
            continue
        e = rng.normal(0.0, rep_sd, (n, cells, repeats, max_starts))
        out[m] = 100.0 * (1.0 + (off + e + prompt) / 100.0) * scale
    return out


def evidence_from_controls(x: np.ndarray) -> tuple[np.ndarray, list[np.ndarray], int]:
    """Earlier windows' control starts (windows, cells, repeats, starts) -> the evidence the gate is given.

    The arithmetic of :mod:`pairaudit.speed.evidence` on simulated windows:
    per window, each start's mean over repeats in % of the window's mean,
    pooled over the cells; the within-window variance, starts - 1 degrees of
    freedom. Returns (pooled variance per window, per-cell variances, df).
    """
    lv = np.log(x).mean(axis=-2)                                          # (W, C, S), as the gate's start values
    rel = 100.0 * (lv - lv.mean(axis=-1, keepdims=True))
    df = x.shape[-1] - 1
    pooled = rel.mean(axis=1).var(axis=-1, ddof=1)
    cells = [rel[:, j].var(axis=-1, ddof=1) for j in range(x.shape[1])]
    return pooled, cells, df


def sequential_verdicts(metrics: Mapping[str, np.ndarray], *, max_starts: int, **kw) -> tuple[np.ndarray, np.ndarray]:
    """The sequential win2-v3 over simulated full brackets: each window's verdict and the starts it used."""
    n = next(iter(metrics.values())).shape[0]
    verdict = np.full(n, "INCONCLUSIVE", dtype=object)
    used = np.full(n, max_starts)
    open_ = np.ones(n, dtype=bool)
    looks = looks_for(max_starts)
    for k in range(3, max_starts + 1, 2):
        core = _win2_v3_core({m: v[..., :k] for m, v in metrics.items()}, looks=looks, **kw)
        v = core["verdict"]
        now = open_ & (v != "INCONCLUSIVE")
        verdict[now] = v[now]
        used[now] = k
        open_ &= ~now
    return verdict.astype(str), used


def sweep_length(n_candidates: int, max_starts: int) -> int:
    """The most starts a shared-control bracket of ``n_candidates`` may run: every candidate to its budget."""
    return 1 + 2 * n_candidates * looks_for(max_starts)


def _sub_evidence(evidence: Mapping[str, Mapping[str, Any]] | None, idx: np.ndarray) -> dict | None:
    """Simulated per-bracket evidence (arrays over brackets) restricted to the brackets ``idx``."""
    if not evidence:
        return None

    def take(e):
        return None if e is None else (np.asarray(e[0])[idx] if np.ndim(e[0]) else e[0], e[1])

    return {m: {"pooled": take(e.get("pooled")), "cells": [take(c) for c in e.get("cells") or []]}
            for m, e in evidence.items()}


@dataclass(frozen=True)
class SweepSimulation:
    """Simulated shared-control brackets: per candidate its verdict and candidate starts, per bracket its starts."""
    verdicts: dict[str, np.ndarray]
    windows: dict[str, np.ndarray]
    starts: np.ndarray


def sweep_verdicts(metrics: Mapping[str, np.ndarray], candidates: Sequence[str], *, max_starts: int,
                   evidence: Mapping[str, Mapping[str, Any]] | None = None, **kw: Any) -> SweepSimulation:
    """The shared-control bracket over simulated timelines: each candidate's verdict, and the starts each ran.

    metrics: metric -> (brackets, cells, repeats, starts) with every odd start a candidate start (which
    candidate is the schedule's: ``sweep_next``); at least ``sweep_length`` starts. Each bracket runs
    round by round; after each round every candidate that got a window looks (``_win2_v3_core`` with its
    ``sweep_layout``), a decided one gets no more starts. Brackets with the same schedule so far are
    evaluated together. ``evidence``: as ``_win2_v3_core``'s, a var may be an array over the brackets.
    """
    n = next(iter(metrics.values())).shape[0]
    budget = looks_for(max_starts)
    cands = list(candidates)
    verdict = {c: np.full(n, "INCONCLUSIVE", dtype=object) for c in cands}
    arms: list[tuple[str, ...]] = [()] * n
    undecided: list[set[str]] = [set(cands) for _ in range(n)]
    used = np.zeros(n, dtype=int)
    while True:
        nxt = [sweep_next(arms[w], cands, undecided[w], budget) for w in range(n)]
        groups: dict[tuple[str, ...], list[int]] = {}
        for w in range(n):
            if nxt[w]:
                arms[w] = arms[w] + tuple(nxt[w])
                groups.setdefault(arms[w], []).append(w)
        if not groups:
            break
        for a, ws in groups.items():
            idx = np.asarray(ws)
            looked = [c for c in cands if c in set(a[-len(nxt[ws[0]]):])]
            sub = {m: v[idx][..., :len(a)] for m, v in metrics.items()}
            for c in looked:
                v = _win2_v3_core(sub, looks=budget, layout=sweep_layout(a, c), evidence=_sub_evidence(evidence, idx),
                                  **kw)["verdict"]
                for j, w in enumerate(ws):
                    verdict[c][w] = v[j]
                    if v[j] != "INCONCLUSIVE":
                        undecided[w].discard(c)
            used[idx] = len(a)
    windows = {c: np.asarray([sweep_windows(arms[w], c) for w in range(n)]) for c in cands}
    return SweepSimulation({c: v.astype(str) for c, v in verdict.items()}, windows, used)


def win2_v3_rates(*, rep_sd: float, start_sd: float, cells: int, repeats: int, max_starts: int,
                  guards: Sequence[str] = (), zero_guards: Sequence[str] = (), win_pct: float = 2.0,
                  alpha_win: float = 0.05, alpha_loss: float = 0.05, start_noise_pct: float = 3.0, min_df: int = 2,
                  evidence_f_alpha: float = 0.05, evidence_df: int = 0, power_gain_pct: float = 3.0,
                  prompt_sd: float = 0.0, n: int = WIN2_V2_RATE_WINDOWS, seed: int = WIN2_V2_RATE_SEED,
                  spending: str = "bonferroni", loss_pooled_share: float | None = None) -> dict:
    """Seeded simulated error rates of the sequential win2-v3 at one noise level.

    ``evidence_df``: the host evidence the gate is given, one simulated earlier window of
    ``evidence_df + 1`` control starts per bracket under the same noise (0: none). false_win / false_loss on
    identical arms; power / power_loss: WIN for a +power_gain_pct change, LOSS for a -power_gain_pct one.
    """
    names = ["primary", *guards]
    kw: dict[str, Any] = dict(primary="primary", guards=list(guards), lower_is_better=(), win_pct=win_pct,
                              alpha_win=alpha_win, alpha_loss=alpha_loss, start_noise_pct=start_noise_pct,
                              min_df=min_df, evidence_f_alpha=evidence_f_alpha, spending=spending,
                              loss_pooled_share=loss_pooled_share)
    rng = np.random.default_rng(seed)

    def run(gain: float) -> tuple[np.ndarray, np.ndarray]:
        sims = simulate_sequences(rng, n, cells=cells, repeats=repeats, rep_sd=rep_sd, start_sd=start_sd,
                                  max_starts=max_starts, gain_pct=gain, prompt_sd=prompt_sd, metrics=names,
                                  zero=zero_guards)
        ev = None
        if evidence_df > 0:
            # each bracket gets its own earlier window: evidence_df + 1 control starts of the same host
            ctrl = simulate_sequences(rng, n, cells=cells, repeats=repeats, rep_sd=rep_sd, start_sd=start_sd,
                                      max_starts=evidence_df + 1, prompt_sd=prompt_sd, metrics=names)
            ev = {}
            for m in names:
                pv, cv, df = evidence_from_controls(ctrl[m])
                ev[m] = {"pooled": (pv, df), "cells": [(c, df) for c in cv]}
        return sequential_verdicts(sims, max_starts=max_starts, evidence=ev, **kw)

    null, used0 = run(0.0)
    up, used_up = run(power_gain_pct)
    down, used_down = run(-power_gain_pct)
    return {"rep_sd_pct": rep_sd, "start_sd_pct": start_sd, "prompt_sd_pct": prompt_sd, "cells": cells,
            "repeats": repeats, "max_starts": max_starts, "evidence_df": evidence_df, "windows": n, "seed": seed,
            "false_win": float((null == "WIN").mean()), "false_loss": float((null == "LOSS").mean()),
            "null_no_win": float((null == "NO_WIN").mean()),
            "null_inconclusive": float((null == "INCONCLUSIVE").mean()), "null_mean_starts": float(used0.mean()),
            "power_gain_pct": power_gain_pct, "power": float((up == "WIN").mean()),
            "power_loss": float((down == "LOSS").mean()), "alt_mean_starts": float(used_up.mean())}


def win2_v3_needed(*, start_var: float, df: int | None, win_pct: float, alpha_win: float, looks: int,
                   limit: int = 41, spending: str = "bonferroni") -> int | None:
    """The smallest odd number of starts whose half-width would reach the bar at this start-to-start variance.

    win2-v3 judges every k at alpha / looks; win2-v4 at the level of k's own look among
    max(looks, looks_for(k)) looks: what a bracket growing to k starts would test at.
    """
    for k in range(3, limit + 1, 2):
        level = (alpha_win / looks if spending == "bonferroni"
                 else look_level(alpha_win, max(looks, looks_for(k)), looks_for(k) - 1, spending))
        q = _q(1.0 - level, None if df is None else max(df, k - 2))
        if q * math.sqrt(arm_factor(k) * start_var) <= log_bar(win_pct):
            return k
    return None


def _win2_sequential(
    rule: str,
    registered: Mapping[str, Any],
    cells: Mapping[str, Mapping[str, Sequence[Sequence[float]]]],
    *,
    primary: str,
    guards: Iterable[str] = (),
    reported: Iterable[str] = (),
    decide: Iterable[str] | None = None,
    lower_is_better: Iterable[str] = (),
    max_starts: int = 5,
    evidence: Mapping[str, Mapping[str, Any]] | None = None,
    win_pct: float = 2.0,
    alpha_win: float = 0.05,
    alpha_loss: float = 0.05,
    start_noise_pct: float = 3.0,
    min_df: int = 2,
    evidence_f_alpha: float = 0.05,
    spending: str = "bonferroni",
    loss_pooled_share: float | None = None,
    arms: Sequence[str] | None = None,
    candidate: str | None = None,
    start_names: Sequence[str] | None = None,
) -> dict:
    """The alternating bracket (C, T, C, T, C ...) decided sequentially, paired by prompt (win2-v3, win2-v4).

    cells: cell -> metric -> per repeat, one value per start in run order
    (control first and last, alternating). evidence: metric -> {"pooled":
    {"var", "df"}, "cells": {cell: {"var", "df"}}} from the host's earlier
    windows of the same control (``pairaudit.speed.evidence``), or None.

    Per cell and metric each start's value is its mean over repeats in % of
    the cell's control mean (prompt effects are the same in every start and
    cancel); the gain is the mean of the candidate starts minus the mean of
    the control starts (alternating, so a linear drift cancels). The
    start-to-start variance is the within-arm variance of the start values,
    pooled with the evidence unless the window is significantly noisier;
    below ``min_df`` degrees of freedom ``start_noise_pct`` is the fallback.
    win2-v3: each of the looks_for(max_starts) looks tests at alpha / looks
    and every loss test gets an equal share; win2-v4: alpha is spent over the
    looks O'Brien-Fleming-type (``obf_levels``) and the pooled loss test gets
    ``loss_pooled_share`` of alpha_loss.

    - WIN: pooled gain over the deciding cells above the bar, its one-sided
      lower bound above 0, and every deciding cell above the bar.
    - LOSS: a deciding cell's primary or guard worse than the bar with its
      upper bound below 0 (each test at alpha_loss / (looks x cells x metrics)).
    - NO_WIN: neither, and the half-width is within the bar.
    - INCONCLUSIVE otherwise; ``more_starts`` says whether the bracket may
      still grow (fewer than max_starts starts so far).

    ``arms`` and ``candidate``: a shared-control bracket of several candidates
    (one arm name per start, ``sweep_layout``), decided for ``candidate``
    over its windows C-T-C: per run of adjacent windows the arm-mean
    difference, weighted by the run's candidate starts; sigma^2 from
    deviations within each run's arms and within the bracket's other control
    starts. ``max_starts`` is then the candidate's own budget: a bracket of
    max_starts starts, (max_starts - 1) / 2 candidate starts. ``start_names``:
    what the result calls the starts (s1, s2, ... by default).
    """
    guards, reported = list(guards), list(reported)
    lib = set(lower_is_better)
    used = {"win_pct": win_pct, "alpha_win": alpha_win, "alpha_loss": alpha_loss, "start_noise_pct": start_noise_pct,
            "min_df": min_df, "evidence_f_alpha": evidence_f_alpha, "spending": spending,
            "loss_pooled_share": loss_pooled_share}
    params, dev, reasons = registered_params({k: used[k] for k in registered}, dict(registered))
    names = list(cells)
    decide = names if decide is None else [c for c in names if c in set(decide)]
    looks = looks_for(max_starts)
    params.update(primary=primary, guards=guards, reported=reported, lower_is_better=sorted(lib),
                  decision_cells=list(decide), max_starts=max_starts, looks=looks)
    n_rep, n_starts = _check_cells(cells, [primary, *guards, *reported], decide, rule)
    bracket_arms(n_starts)  # refuses an even or too short bracket
    layout = None
    if arms is None:
        if n_starts > max_starts:
            raise ValueError(f"{n_starts} starts exceed max_starts {max_starts}")
    else:
        if len(arms) != n_starts or candidate is None:
            raise ValueError(f"a shared-control bracket needs one arm per start ({n_starts}) and the candidate "
                             f"decided, got arms {list(arms)} and candidate {candidate!r}")
        layout = sweep_layout(arms, candidate)
        if layout.n_windows > looks:
            raise ValueError(f"{candidate}: {layout.n_windows} candidate starts exceed its budget of {looks} "
                             f"(max_starts {max_starts})")
    out: dict[str, Any] = {"rule": rule, "params": params, "deviations": dev, "repeats": n_rep,
                           "starts": n_starts if layout is None else len(layout.starts),
                           "arms": bracket_arms(n_starts) if layout is None else list(layout.arms)}
    if layout is not None:
        names_of = list(start_names) if start_names is not None else [f"s{k + 1}" for k in range(n_starts)]
        if len(names_of) != n_starts:
            raise ValueError(f"{len(names_of)} start names for {n_starts} starts")
        out["sweep"] = {"candidate": candidate, "bracket_starts": n_starts,
                        "windows": [[names_of[k] for k in w] for w in layout.windows],
                        "control_starts": [names_of[k] for k in layout.controls],
                        "pooled_control_starts": [names_of[k] for k in layout.others],
                        "runs": len(layout.runs), "variance_factor": layout.factor}

    def arr(cs, m):
        return np.asarray([[cells[c][m] for c in cs]], dtype=float)       # (1, C, R, S)

    def ev_for(cs):
        if not evidence:
            return None
        out_ev = {}
        for m, e in evidence.items():
            pooled = e.get("pooled")
            per = e.get("cells") or {}
            out_ev[m] = {"pooled": None if not pooled else (pooled["var"], pooled["df"]),
                         "cells": [None if c not in per else (per[c]["var"], per[c]["df"]) for c in cs]}
        return out_ev

    kw: dict[str, Any] = dict(lower_is_better=lib, win_pct=win_pct, alpha_win=alpha_win, alpha_loss=alpha_loss,
                              start_noise_pct=start_noise_pct, min_df=min_df, evidence_f_alpha=evidence_f_alpha,
                              looks=looks, spending=spending, loss_pooled_share=loss_pooled_share, layout=layout)
    core = _win2_v3_core({m: arr(decide, m) for m in [primary, *guards]}, primary=primary, guards=guards,
                         evidence=ev_for(decide), **kw)
    pn = core["noise"]
    ev_p = (evidence or {}).get(primary, {}).get("pooled")
    fallback = bool(pn["fallback"][0])
    source = ("fallback: the registered start_noise_pct (fewer than min_df degrees of freedom)" if fallback
              else "this window and the host's earlier windows of this control" if bool(pn["pooled_evidence"][0])
              else "this window alone" + (" (the host's evidence was quieter than this window: not pooled)"
                                          if ev_p else ""))
    noise: dict[str, Any] = {
        "rep_sd_pct": repeat_noise_sd(arr(decide, primary)[0]),
        "start_sd_pct": math.sqrt(float(core["window_var"][0])), "window_df": int(core["window_df"]),
        "evidence_sd_pct": None if not ev_p else math.sqrt(ev_p["var"]),
        "evidence_df": None if not ev_p else int(ev_p["df"]),
        "evidence_windows": None if not ev_p else ev_p.get("windows"),
        "start_sd_used_pct": math.sqrt(float(pn["used_var"][0])), "df_used": None if fallback else int(pn["df"][0]),
        "source": source, "start_values_pct": _nums(core["pooled_values"][0]),
    }
    # the gate tests on the log scale; what it reports is in % of the control
    lg, half = float(core["pooled_gain"][0]), float(core["half_width"][0])
    gain, lower = pct_of_log(lg), pct_of_log(lg - half)
    verdict = str(core["verdict"][0])
    need = win2_v3_needed(start_var=float(pn["used_var"][0]), df=None if fallback else int(pn["df"][0]),
                          win_pct=win_pct, alpha_win=alpha_win, looks=looks, spending=spending)
    per_cell: dict[str, dict[str, Any]] = {}
    for j, c in enumerate(decide):
        cell_loss = [m for m in core["loss_by"] if core["loss_by"][m][0, j]]
        cg = pct_of_log(float(core["cell_gain"][primary][0, j]))
        per_cell[c] = {"decides": True,
                       "primary": {"point_gain_pct": cg,
                                   "start_values_pct": _nums(core["values"][primary][0, j]),
                                   "start_sd_pct": math.sqrt(float(core["cell_noise"][primary]["var"][0, j]))},
                       "guards": {g: {"point_gain_pct": _v3_pct(core["values"][g][0, j], core["cell_gain"][g][0, j]),
                                      "guard_verdict": "LOSS" if g in cell_loss else "OK"} for g in guards},
                       "losses": cell_loss,
                       "verdict": "LOSS" if cell_loss else ("ABOVE_BAR" if cg > win_pct else "NOT_ABOVE_BAR")}
    for c in [c for c in names if c not in decide]:
        one = _win2_v3_core({m: arr([c], m) for m in [primary, *guards]}, primary=primary, guards=guards,
                            evidence=ev_for([c]), **kw)
        per_cell[c] = {"decides": False, "verdict": str(one["verdict"][0]),
                       "primary": {"point_gain_pct": pct_of_log(float(one["pooled_gain"][0])),
                                   "start_values_pct": _nums(one["pooled_values"][0])},
                       "guards": {g: {"point_gain_pct": _v3_pct(one["values"][g][0, 0], one["cell_gain"][g][0, 0]),
                                      "guard_verdict": "LOSS" if one["loss_by"][g][0, 0] else "OK"} for g in guards}}
    rep_res = {}
    for m in reported:
        one = _win2_v3_core({m: arr(decide, m)}, primary=m, guards=[], evidence=None, **kw)
        rep_res[m] = {"verdict": str(one["verdict"][0]), "point_gain_pct": pct_of_log(float(one["pooled_gain"][0])),
                      "lower_is_better": m in lib}
    lv = {k: float(v[0]) for k, v in core["levels"].items()}  # the strictest cell test's where cells differ
    a_pct = 100 * lv["win"]
    own = n_starts if layout is None else len(layout.starts)
    summary = (f"primary {primary}: gain {gain:+.2f} % over {len(decide)} deciding cell(s) and {own} starts "
               f"vs bar {win_pct} %, one-sided {100 - a_pct:.4g} % lower bound {lower:+.2f} % (half-width "
               f"{half:.2f} % on the log scale); noise: per repeat {noise['rep_sd_pct']:.2f} % (prompt effects removed), start to "
               f"start {noise['start_sd_pct']:.2f} % in this window ({noise['window_df']} df)"
               + (f", {noise['evidence_sd_pct']:.2f} % in the host's evidence ({noise['evidence_df']} df)"
                  if ev_p else ", no host evidence")
               + f"; used {noise['start_sd_used_pct']:.2f} % from {source}"
               + ("" if layout is None else
                  f"; {candidate}'s {layout.n_windows} window(s) against control starts "
                  f"{out['sweep']['control_starts']}, the bracket's other control starts "
                  f"{out['sweep']['pooled_control_starts'] or 'none'} pooled into the start-to-start variance"))
    more = verdict == "INCONCLUSIVE" and (n_starts + 2 <= max_starts if layout is None
                                          else layout.n_windows + 1 <= looks)
    if verdict == "LOSS":
        if bool(core["pooled_loss"][0]):
            reasons.append(f"primary {primary} pooled over the deciding cells: {gain:+.2f} %, worse than the bar "
                           f"beyond the noise (this test at {100 * lv['loss_pooled']:.3g} % at this look)")
        for c, pc in per_cell.items():
            if pc.get("decides") and pc.get("losses"):
                reasons.append(f"{c}: {', '.join(pc['losses'])} worse than the bar beyond the noise (each cell's "
                               f"test at {100 * lv['loss_cell']:.3g} % at this look)")
    elif verdict == "WIN":
        reasons.append("gain above the bar in every deciding cell and its lower bound above 0")
    elif verdict == "NO_WIN":
        reasons.append("speed gain not shown, and the bracket resolves the bar (half-width <= bar)")
    else:
        how = ("no bracket of up to 41 starts would resolve it at this noise" if need is None
               else f"about {need} starts would resolve it" if layout is None
               else f"about {(need - 1) // 2} candidate starts would resolve it")
        reasons.append(f"too noisy to decide at the {win_pct} % bar after {own} starts: half-width {half:.2f} % "
                       f"> {log_bar(win_pct):.2f} % (the bar on the log scale); {how}" + ("; the bracket grows by a candidate and a control start" if more
                                                  else f" (max_starts {max_starts} reached)"))
    reasons.append(summary)
    if not core["consistent"][0] and verdict != "LOSS":
        low = [c for c in decide if per_cell[c]["primary"]["point_gain_pct"] <= win_pct]
        reasons.append(f"cells not above the bar: {low}")
    for m, r in rep_res.items():
        reasons.append(f"reported {m}: {r['verdict']} ({r['point_gain_pct']:+.3f} %), does not decide")
    out.update(verdict=verdict, more_starts=more, reasons=reasons, cells=per_cell, reported=rep_res, noise=noise,
               needed={"starts_needed": need, "half_width_pct": half}, pooled_gain_pct=gain, half_width_pct=half,
               lower_bound_pct=lower, log_gain=lg, loss_tests=core["n_loss_tests"], looks=looks,
               alpha_per_look={"win": lv["win"], "loss_pooled": lv["loss_pooled"], "loss_cell": lv["loss_cell"]})
    return out


def win2_v3(cells: Mapping[str, Mapping[str, Sequence[Sequence[float]]]], **kw: Any) -> dict:
    """win2-v3: the sequential alternating bracket, alpha / looks at every look, an equal share per loss test."""
    return _win2_sequential("win2-v3", WIN2_V3, cells, **kw)


def win2_v4(cells: Mapping[str, Mapping[str, Sequence[Sequence[float]]]], *, spending: str = "obf",
            loss_pooled_share: float | None = 0.5, **kw: Any) -> dict:
    """win2-v4: win2-v3's bracket with alpha spent O'Brien-Fleming-type over the looks and half of alpha_loss
    on the pooled loss test (``WIN2_V4``)."""
    return _win2_sequential("win2-v4", WIN2_V4, cells, spending=spending, loss_pooled_share=loss_pooled_share,
                            **kw)
